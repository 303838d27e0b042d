"""What a person watching the run sees: progress bar, trackers, loss-curve PNG (the step log is `modeling_xl.runs`)."""

from __future__ import annotations

import time
from pathlib import Path

from tqdm.auto import tqdm

from ..runtime.run_folder import read_log

PLOT_FILE = "loss_curve.png"


class Progress:
    """tqdm bar (main process) with the loss, tokens/s and ETA (tqdm's own, from the step rate)."""

    def __init__(self, total: int, initial: int, tokens_per_step: int, enabled: bool):
        self.bar = tqdm(total=total, initial=initial, disable=not enabled, desc="train", unit="step",
                        dynamic_ncols=True)
        self.tokens_per_step = tokens_per_step
        self.start, self.start_step = time.perf_counter(), initial

    def update(self, step: int, loss: float) -> float:
        """Advance to `step`; returns tokens/s since the start of this (possibly resumed) run."""
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        tokens_per_second = (step - self.start_step) * self.tokens_per_step / elapsed
        self.bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens_per_second:,.0f}", refresh=False)
        self.bar.update(step - self.bar.n)
        return tokens_per_second

    def write(self, message: str) -> None:
        self.bar.write(message) if not self.bar.disable else None

    def close(self) -> None:
        self.bar.close()


def tracker_names(report_to: str) -> list[str]:
    """Trackers Accelerate should start: tensorboard, and trackio when it is installed (and Accelerate has its
    tracker: 1.9 and later)."""
    from accelerate import utils

    wanted = {"tensorboard", "trackio"} if report_to == "all" else ({report_to} - {"none"})
    names = []
    has_trackio_tracker = hasattr(utils, "is_trackio_available")  # Accelerate 1.9 and later
    trackio_available = has_trackio_tracker and utils.is_trackio_available()
    for name, available in (("tensorboard", utils.is_tensorboard_available()), ("trackio", trackio_available)):
        if name in wanted:
            if not available and report_to != "all":
                if name == "trackio" and not has_trackio_tracker:
                    import accelerate

                    raise ValueError(f"report_to={report_to!r} but Accelerate {accelerate.__version__} has no trackio "
                                     "tracker; expected accelerate>=1.9 or another --report_to")
                raise ValueError(f"report_to={report_to!r} but {name} is not installed; expected `pip install {name}`"
                                 " or another --report_to")
            if available:
                names.append(name)
    return names


def plot_losses(log_path, png_path, title: str = "Transformer-XL pretraining") -> Path | None:
    """Training loss per step and validation loss at each evaluation, as a PNG (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_log(log_path)
    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    evals = [(r["step"], r["eval_loss"]) for r in records if "eval_loss" in r]
    if not train and not evals:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    if train:
        ax.plot(*zip(*train), label="train loss", linewidth=1.0)
    if evals:
        ax.plot(*zip(*evals), "o-", label="validation loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("NLL per token (nats)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path)
    plt.close(fig)
    return Path(png_path)
