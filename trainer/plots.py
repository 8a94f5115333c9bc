"""PNG curves of a training run, from its JSONL logs (matplotlib's Agg backend: no display needed).

``curves`` is pure (metrics in, named series out); ``write_plots`` draws one PNG per curve and
returns the paths it wrote. A metric missing from every step gives no plot rather than an empty one.
``write_family_plot`` draws the held-out resolved rate per family, before and after PPO.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

# (file stem, title, y label, how to read it from one step's metrics)
CURVES = (
    ("reward", "Mean reward per step (passed / 20)", "reward", lambda m: m.get("reward")),
    ("resolved", "Resolved rate per step", "resolved", lambda m: m.get("resolved")),
    ("explained_variance", "Critic explained variance", "explained variance", lambda m: m.get("explained_variance")),
    ("logprob_gap", "Train / inference log-prob gap", "mean |Δ log p|", lambda m: m.get("logprob_gap")),
    (
        "straggler_bias",
        "Straggler bias: TV(launched, kept) per family",
        "total variation",
        lambda m: (m.get("scheduler") or {}).get("families", {}).get("tv_distance"),
    ),
)


def curves(metrics: Sequence[dict]) -> dict[str, tuple[list[int], list[float]]]:
    """For each curve, the steps where it has a finite value and those values."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for stem, _, _, read in CURVES:
        points = [(m["step"] + 1, read(m)) for m in metrics]
        points = [(s, float(v)) for s, v in points if isinstance(v, (int, float)) and math.isfinite(v)]
        if points:
            out[stem] = ([s for s, _ in points], [v for _, v in points])
    return out


def family_bars(heldout: Mapping[str, Mapping[str, Mapping[str, float]]]) -> tuple[list[str], dict[str, list[float]]]:
    """Pure: the families of the first evaluation in ``heldout`` (label -> family -> its
    ``resolved``) and, per label, each family's resolved rate (NaN where a label lacks it)."""
    families = list(next(iter(heldout.values()), {}))
    rates = {label: [float(by.get(f, {}).get("resolved", math.nan)) for f in families] for label, by in heldout.items()}
    return families, rates


def write_family_plot(path: Path, heldout: Mapping[str, Mapping[str, Mapping[str, float]]]) -> Path:
    """Grouped bars of the held-out resolved rate per family, one bar per evaluation (e.g.
    supervised start, after PPO, teacher)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    families, rates = family_bars(heldout)
    figure, axes = plt.subplots(figsize=(7, 3.8), dpi=100)
    width = 0.8 / max(len(rates), 1)
    for i, (label, values) in enumerate(rates.items()):
        axes.bar([x + i * width for x in range(len(families))], values, width, label=label)
    axes.set_xticks([x + width * (len(rates) - 1) / 2 for x in range(len(families))], families, rotation=20, fontsize=8)
    axes.set(title="Held-out resolved rate per family (greedy)", ylabel="resolved", ylim=(0, 1))
    axes.legend(loc="best", fontsize=8)
    axes.grid(alpha=0.3, axis="y")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return path


def write_plots(
    out_dir: Path, metrics: Sequence[dict], *, sft_losses: Sequence[float] = (), warmup_steps: int = 0
) -> list[Path]:
    """One PNG per curve under ``out_dir`` (and ``sft_loss.png`` when losses are given); the
    critic warm-up steps are shaded."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    titles = {stem: (title, label) for stem, title, label, _ in CURVES}
    written = []
    series = curves(metrics)
    if sft_losses:
        series["sft_loss"] = (list(range(1, len(sft_losses) + 1)), list(sft_losses))
        titles["sft_loss"] = ("Supervised warm start: loss per step", "cross-entropy")
    for stem, (steps, values) in series.items():
        figure, axes = plt.subplots(figsize=(6, 3.5), dpi=100)
        axes.plot(steps, values, marker="o" if len(steps) < 60 else None, linewidth=1.5)
        if warmup_steps and stem != "sft_loss":
            axes.axvspan(0.5, warmup_steps + 0.5, color="grey", alpha=0.15, label="critic warm-up")
            axes.legend(loc="best", fontsize=8)
        title, label = titles[stem]
        axes.set(title=title, xlabel="step", ylabel=label)
        axes.grid(alpha=0.3)
        figure.tight_layout()
        path = out_dir / f"{stem}.png"
        figure.savefig(path)
        plt.close(figure)
        written.append(path)
    return written
