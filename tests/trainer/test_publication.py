"""Weight publication (``trainer/publication.py``) without a vLLM engine: an engine that loads
each published file as a checkpoint directory, the way a fresh vLLM would read it. The sequence
both vLLM samplers share (load, write, engine load, check, ``PublicationMismatch``) runs here in
full; ``test_vllm_sampler.py`` and ``test_server_sampler.py`` run it against real engines."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from termgym.errors import ConfigError
from termgym.trainer.publication import (
    PROBE_LENGTH,
    PUBLICATION_TOLERANCE,
    WORKER_EXTENSION,
    PublicationMismatch,
    WeightPublisher,
    WeightSync,
    probe_ids,
    trainer_logprobs,
)


class CheckpointEngine(WeightPublisher):
    """Serves ``served``, replaced at each publication by the published file loaded as the
    checkpoint of a model directory; ``garble`` scales what it loads (a transport that corrupts)."""

    def __init__(self, model: PreTrainedModel, scratch: Path, garble: float = 1.0) -> None:
        super().__init__(model, tolerance=PUBLICATION_TOLERANCE, scratch_prefix="weights-", scratch_parent=scratch)
        self.config = model.config
        self.served: PreTrainedModel = copy.deepcopy(model)
        self.garble, self.closed, self.files = garble, False, []

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("the test engine is closed")

    def _load_weights(self, path: str, version: int) -> torch.Tensor:
        self.files.append(Path(path))
        directory = Path(self._weights_dir) / f"version-{version}"
        directory.mkdir()
        self.config.save_pretrained(directory)
        (directory / "model.safetensors").write_bytes(Path(path).read_bytes())
        self.served = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, dtype=torch.float32)
        with torch.no_grad():
            for weight in self.served.get_input_embeddings().parameters():
                weight.mul_(self.garble)
        return self.prompt_logprobs(self.probe_ids)

    def prompt_logprobs(self, ids) -> torch.Tensor:
        return trainer_logprobs(self.served, ids)


def moved(model: torch.nn.Module, seed: int) -> dict:
    """``model``'s weights with every tensor moved a little."""
    generator = torch.Generator().manual_seed(seed)
    state = copy.deepcopy(model.state_dict())
    for tensor in state.values():
        if tensor.is_floating_point():
            tensor.add_(torch.randn(tensor.shape, generator=generator) * 0.05)
    return state


def test_a_publication_reaches_the_engine_through_a_checkpoint_file(tiny_policy, tmp_path):
    policy, _ = tiny_policy
    engine = CheckpointEngine(copy.deepcopy(policy), tmp_path)
    before = engine.prompt_logprobs(engine.probe_ids)
    state = moved(policy, seed=0)
    engine.publish(state, version=1)
    assert engine.version == 1 and engine.publication_gap is not None and engine.publication_gap < 1e-5
    assert float((engine.prompt_logprobs(engine.probe_ids) - before).abs().max()) > 0.05  # the engine moved
    assert all(torch.equal(engine.model.state_dict()[k], v) for k, v in state.items())  # so did the trainer's copy
    assert engine.files and not any(f.exists() for f in engine.files)  # the weight file is removed after the load
    assert engine.publish_seconds is not None
    # a trainer copy the engine was not told about is caught by the check
    trainer_copy = engine.model
    assert isinstance(trainer_copy, PreTrainedModel)
    with torch.no_grad():
        for weight in trainer_copy.get_input_embeddings().parameters():
            weight.mul_(1.5)
    assert engine.check_publication() > 1e-2 and engine.check_publication([5, 6, 7, 8]) > 1e-2


def test_a_publication_the_engine_did_not_take_fails_in_one_line(tiny_policy, tmp_path):
    policy, _ = tiny_policy
    engine = CheckpointEngine(copy.deepcopy(policy), tmp_path, garble=3.0)
    with pytest.raises(
        PublicationMismatch, match=r"after publishing version 3 the engine's log-probs differ"
    ) as caught:
        engine.publish(policy.state_dict(), version=3)
    assert "\n" not in str(caught.value) and f"tolerance {PUBLICATION_TOLERANCE:g}" in str(caught.value)
    assert engine.publication_gap is not None and engine.publication_gap > 1e-2
    assert not any(f.exists() for f in engine.files)
    engine.closed = True
    with pytest.raises(RuntimeError, match="closed"):
        engine.publish(policy.state_dict(), version=4)


def test_the_probe_spans_the_vocabulary_and_needs_one(tiny_policy):
    policy, _ = tiny_policy
    ids = probe_ids(policy)
    assert len(ids) == PROBE_LENGTH and max(ids) < policy.config.vocab_size and len(set(ids)) == PROBE_LENGTH
    with pytest.raises(ConfigError, match="no vocab_size"):
        probe_ids(torch.nn.Linear(2, 2))


def test_the_worker_extension_imports_by_its_name_and_its_earlier_one():
    import importlib

    module, _, name = WORKER_EXTENSION.rpartition(".")
    assert getattr(importlib.import_module(module), name) is WeightSync
    from termgym.trainer.vllm_sampler import WeightSync as earlier  # servers started before publication.py

    assert earlier is WeightSync
