"""Weight publication: how the trainer's weights get into an engine that samples with its own copy
of them, and the check that they did. Two samplers have such an engine: ``VllmSampler``
(``trainer/vllm_sampler.py``) and ``ServerSampler`` (a running ``vllm serve``,
``trainer/server_sampler.py``); both publish through ``WeightPublisher``.

One publication (``WeightPublisher.publish``, once per PPO step): load the weights into the
trainer-side copy (``model``), write them as a safetensors file in the sampler's scratch directory,
have the engine load it in place through the worker extension (``WeightSync``, by
``collective_rpc``) and drop its prefix cache, then compare the engine's prompt log-probs on a fixed
prompt (``probe_ids``) with the trainer-side copy's (``trainer_logprobs``).

Guaranteed: after ``publish`` returns, ``publication_gap`` is at most ``tolerance``; beyond it
``publish`` raises ``PublicationMismatch`` (one line, the gap recorded). The file is removed whether
the load works or not. Not guaranteed: agreement on prompts other than the probe
(``check_publication(ids)`` measures any), or anything about sampling between publications. A vLLM
server must import the worker extension: ``--worker-extension-cls`` ``WORKER_EXTENSION`` (its
earlier name, ``termgym.trainer.vllm_sampler.WeightSync``, is still accepted).

Why a file and an extension: docs/guides/training.md#how-weights-get-in-and-why-this-way."""

from __future__ import annotations

import os
import secrets
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import torch

from termgym.errors import ConfigError, TrainingError

from . import losses

PUBLICATION_TOLERANCE = 1e-3  # max |logp_engine - logp_trainer| after a publication (measured: 1e-6 in float32)
PROBE_LENGTH = 48  # ids in the publication check's fixed prompt
WORKER_EXTENSION = "termgym.trainer.publication.WeightSync"  # vLLM's --worker-extension-cls
WORKER_EXTENSIONS = (WORKER_EXTENSION, "termgym.trainer.vllm_sampler.WeightSync")  # the earlier name still works
LOAD_METHOD = "termgym_load_weights"  # WeightSync's method, called through collective_rpc


class PublicationMismatch(TrainingError):
    """After a publication the engine's log-probs differ from the trainer's beyond the tolerance."""


def probe_ids(model: torch.nn.Module) -> list[int]:
    """The publication check's fixed prompt: ``PROBE_LENGTH`` ids spread over ``model``'s vocabulary."""
    vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or 0)
    if vocab < 1:
        raise ConfigError("the sampler's model has no vocab_size in its config")
    return [(7 * i + 3) % vocab for i in range(PROBE_LENGTH)]


def trainer_logprobs(model: torch.nn.Module, ids: Sequence[int]) -> torch.Tensor:
    """``model``'s log-probability of ``ids[1:]``, each given the ids before it (float32, CPU)."""
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([list(ids)], device=device)).logits[0, :-1]
    return losses.token_logprobs(logits, torch.tensor(list(ids[1:]), device=device)).cpu()


def checkpoint_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s weights as its checkpoint on disk names them (what ``save_pretrained`` writes and
    vLLM's loaders read): tied copies dropped, fused expert tensors split back per expert."""
    from transformers import PreTrainedModel
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    assert isinstance(model, PreTrainedModel)  # the policy vLLM serves: a Hugging Face causal LM
    state = remove_tied_weights_from_state_dict(dict(model.state_dict()), model)
    return {name: tensor.detach().contiguous() for name, tensor in revert_weight_conversion(model, state).items()}


def scratch_dir(prefix: str, parent: str | os.PathLike | None = None) -> str:
    """A new directory for the weight files of publications: under ``parent``, else in memory
    (``/dev/shm``) where the machine has it, else the temporary directory. The caller removes it."""
    if parent is None and os.path.isdir("/dev/shm"):
        parent = "/dev/shm"
    return tempfile.mkdtemp(prefix=prefix, dir=parent)


class WeightPublisher(ABC):
    """The publication side of a sampler whose engine holds its own copy of the weights (module
    docstring): ``model`` is the trainer-side copy (``publish`` loads into it; the check compares
    against it), ``version`` the last version published, ``publication_gap`` the gap found then.
    A subclass says how its engine loads a file (``_load_weights``), answers prompt log-probs
    (``prompt_logprobs``) and refuses work once closed (``_check_open``)."""

    engine_name: ClassVar[str] = "engine"  # what the mismatch message calls it

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        tolerance: float,
        scratch_prefix: str,
        scratch_parent: str | os.PathLike | None = None,
    ) -> None:
        self.model, self.version, self.tolerance = model.eval(), 0, tolerance
        self.probe_ids = probe_ids(model)
        self.publication_gap: float | None = None  # max |logp| difference at the last check
        self.publish_seconds: float | None = None  # the last publication, weights to check
        # where the weight files go (``scratch_dir``); the subclass removes it when it closes
        self._weights_dir = scratch_dir(scratch_prefix, scratch_parent)

    @abstractmethod
    def _check_open(self) -> None:
        """Raise ``RuntimeError`` once the sampler is closed."""

    @abstractmethod
    def _load_weights(self, path: str, version: int) -> torch.Tensor:
        """Have the engine load the safetensors file at ``path`` in place (no turn sampled with
        part of it), drop its prefix cache and record ``version``; return its ``prompt_logprobs``
        of ``probe_ids`` under the new weights."""

    @abstractmethod
    def prompt_logprobs(self, ids: Sequence[int]) -> torch.Tensor:
        """The engine's log-probability of ``ids[1:]``, each given the ids before it."""

    def publish(self, state_dict: dict, version: int) -> None:
        """Serve these weights from now on (module docstring); ``PublicationMismatch`` when the
        engine's log-probs on the fixed prompt then differ from the trainer's beyond the tolerance."""
        from safetensors.torch import save_file

        self._check_open()
        began = time.monotonic()
        self.model.load_state_dict(state_dict)
        expected = trainer_logprobs(self.model, self.probe_ids)
        path = Path(self._weights_dir) / f"weights-{version}-{secrets.token_hex(4)}.safetensors"
        save_file(checkpoint_state_dict(self.model), str(path))
        try:
            served = self._load_weights(str(path), version)
        finally:
            path.unlink(missing_ok=True)
        self.version = version
        self.publication_gap = float((served - expected).abs().max())
        self.publish_seconds = time.monotonic() - began
        if self.publication_gap > self.tolerance:
            raise PublicationMismatch(
                f"after publishing version {version} the {self.engine_name}'s log-probs differ from the "
                f"trainer's by {self.publication_gap:.3g} (tolerance {self.tolerance:g})"
            )

    def check_publication(self, ids: Sequence[int] | None = None) -> float:
        """Max |engine - trainer| log-prob over ``ids`` (default: the fixed probe prompt)."""
        ids = list(self.probe_ids if ids is None else ids)
        return float((self.prompt_logprobs(ids) - trainer_logprobs(self.model, ids)).abs().max())


class WeightSync:
    """vLLM worker extension (runs inside the engine's worker process, mixed into vLLM's worker
    class by ``--worker-extension-cls``): reload weights in place."""

    def termgym_load_weights(self, path: str) -> int:
        """Load the safetensors file at ``path`` (checkpoint names) into the running model and
        refresh what the CPU backend derived from the old weights. Returns tensors loaded."""
        from safetensors.torch import load_file
        from vllm.platforms import current_platform

        named = load_file(path)
        weights = iter(named.items())
        # model_runner is the vLLM worker's, which this class is mixed into (worker_extension_cls)
        self.model_runner.reload_weights(weights_iterator=weights)  # pyright: ignore[reportAttributeAccessIssue]
        if current_platform.is_cpu():
            # model_runner is the vLLM worker's, as above
            for module in self.model_runner.get_model().modules():  # pyright: ignore[reportAttributeAccessIssue]
                method = getattr(module, "quant_method", None)
                experts = getattr(getattr(method, "moe_kernel", None), "fused_experts", None)
                if experts is not None and hasattr(module, "w13_weight"):
                    # on a weight update vLLM copies raw expert weights over the prepacked ones
                    experts.process_weights_after_loading(module)
                elif (
                    hasattr(module, "cpu_linear")
                    and getattr(module, "weight", None) is not None
                    and module.weight.numel()
                ):
                    # a layer that keeps its weight (a tied LM head) also holds a packed copy
                    assert method is not None  # a vLLM linear layer has its linear method
                    method.process_weights_after_loading(module)
        return len(named)
