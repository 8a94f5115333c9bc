"""``base64_length``: the output caps of downloads (``base64 -w 0``) and of the inspect provider's
streams (``base64``, lines of 76) are exact, checked against the real tool."""

from __future__ import annotations

import os
import subprocess

import pytest

from termgym.sandboxes.base import base64_length


@pytest.mark.parametrize("size", [0, 1, 2, 3, 56, 57, 58, 114, 171, 1000, 12345])
def test_the_length_is_what_base64_prints(size):
    data = os.urandom(size)
    unwrapped = subprocess.run(["base64", "-w", "0"], input=data, capture_output=True, check=True).stdout
    wrapped = subprocess.run(["base64"], input=data, capture_output=True, check=True).stdout
    assert len(unwrapped) == base64_length(size)
    assert len(wrapped) == base64_length(size, line=76)
