"""The memory calculator of notebook 01, the static "four stages" figure it draws, the whole budget
(model states + activations) that notebook 08 closes it with, and a one-line fallback note.

Both take the LEARNER's functions as arguments and draw what they return; nothing here knows
the per-stage formulas. The split of a bar into families comes from the learner's totals:

    T_s = model_state_bytes(num_params, world_size, s)        s = 0, 1, 2, 3
    full family sizes from bytes_per_parameter() x num_params:
        P = params,  G = grads,  O = master_params + momentum + variance
    stage 1 removes T_0 - T_1 from the optimizer family, stage 2 removes T_1 - T_2 more from the
    gradients, stage 3 removes T_2 - T_3 more from the parameters (ZeRO's order: O, then G, then P).

A wrong formula shows up as a bar whose pieces do not add up: the calculator then warns.

    calc = memory_calculator(bytes_per_parameter, model_state_bytes, max_num_params)
    display(calc.widget)                      # sliders, bars per rank, "what fits"
    calc.controls["world_size"].value = 8     # bars and text update (calc.data, calc.figure)

Without ipywidgets (a front end that has none), calc.widget is a static view of the same text
and figure for the initial values.

    budget = budget_breakdown(model_state_bytes, activation_bytes, Ψ, N, L, C, a, V, B, T)
    draw_budget(ax, budget, device_bytes=32e9)   # states + activations, without/with checkpointing

    show_fallback("the proof needs your dp_train_step", "its figure is skipped until it runs", e)
"""
from __future__ import annotations

import base64
import io
import types

from matplotlib.figure import Figure

FAMILIES = ("params", "grads", "optimizer")
FAMILY_LABELS = {"params": "parameters (working copy)", "grads": "gradients",
                 "optimizer": "optimizer state (master + moments)"}
FAMILY_COLORS = {"params": "#1f77b4", "grads": "#ff7f0e", "optimizer": "#2ca02c"}
STAGE_NAMES = ["DP (stage 0)", "ZeRO-1 (P_os)", "ZeRO-2 (P_os+g)", "ZeRO-3 (P_os+g+p)"]
GB = 1e9


def stage_breakdown(bytes_per_parameter, model_state_bytes, num_params, world_size,
                    precision="mixed", optimizer="adam"):
    """Bytes ONE rank holds at stages 0..3, split into params / grads / optimizer state.

    Args:
        bytes_per_parameter, model_state_bytes: the learner's functions (notebook 01).
        num_params: Ψ, the model's parameter count.
        world_size: N, the number of data-parallel ranks.
        precision, optimizer: passed on to the learner's functions.
    Returns:
        list of 4 dicts {"params", "grads", "optimizer", "total", "consistent"}, one per stage:
        "total" is the learner's model_state_bytes; "consistent" says whether the pieces add up
        to it and none is negative.
    """
    per = bytes_per_parameter(precision, optimizer)
    full = {"params": per.get("params", 0) * num_params,
            "grads": per.get("grads", 0) * num_params,
            "optimizer": sum(per.get(k, 0) for k in ("master_params", "momentum", "variance"))
            * num_params}
    totals = [float(model_state_bytes(num_params, world_size, s, precision, optimizer))
              for s in range(4)]
    kept = dict(full)
    out = []
    for s, family in enumerate((None,) + FAMILIES[::-1]):   # stage 1: O, 2: G, 3: P
        if family is not None:
            kept[family] -= totals[s - 1] - totals[s]
        row = {f: max(kept[f], 0.0) for f in FAMILIES}
        row["total"] = totals[s]
        row["consistent"] = (all(kept[f] >= -1e-6 * max(totals[0], 1) for f in FAMILIES)
                             and abs(sum(kept.values()) - totals[s]) <= 1e-6 * max(totals[0], 1))
        out.append(row)
    return out


def draw_stages(ax, breakdown, device_bytes=None, highlight=None, title=None, unit=GB):
    """Stacked bars (one per stage) of the bytes one rank holds; returns the bar containers.

    Args:
        ax: a matplotlib Axes.
        breakdown: stage_breakdown(...)'s list.
        device_bytes: if given, a dashed line at the device's memory.
        highlight: stage index drawn with a thick black edge.
        title: the axes' title.
        unit: bytes per unit of the y axis (GB = 1e9).
    """
    xs = list(range(len(breakdown)))
    bottom = [0.0] * len(xs)
    containers = []
    for f in FAMILIES:
        h = [row[f] / unit for row in breakdown]
        containers.append(ax.bar(xs, h, bottom=bottom, color=FAMILY_COLORS[f],
                                 label=FAMILY_LABELS[f]))
        bottom = [b + v for b, v in zip(bottom, h)]
    for x, row in zip(xs, breakdown):
        ax.annotate(f"{row['total'] / unit:.3g}", (x, row["total"] / unit), ha="center",
                    va="bottom")
    if highlight is not None:
        ax.bar([highlight], [bottom[highlight]], fill=False, edgecolor="black", linewidth=2.5)
    if device_bytes is not None:
        ax.axhline(device_bytes / unit, color="crimson", linestyle="--",
                   label=f"device memory ({device_bytes / unit:g} GB)")
    ax.set_xticks(xs, STAGE_NAMES[:len(xs)], rotation=10)
    ax.set_xlabel("ZeRO stage")
    ax.set_ylabel("model states on one rank (GB)")
    ax.set_title(title or "bytes of model states held by one rank")
    ax.legend(loc="upper right", fontsize="small")
    return containers


# Model sizes of the paper (GPT-2 1.5B, 7.5B, 14B, 128B), GPT-3 (175B), and 1-2-5 steps between.
PAPER_SIZES = (1.5e9, 7.5e9, 14e9, 128e9, 175e9)


def _size_label(n: float) -> str:
    for unit, name in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if n >= unit:
            return f"{n / unit:g}{name}"
    return f"{n:g}"


def model_sizes(extra: float | None = None) -> list[tuple[str, float]]:
    """(label, Ψ) options of the calculator's size slider: 1M to 10T, plus `extra` if given."""
    sizes = {float(m * 10 ** e) for e in range(6, 13) for m in (1, 2, 5)} | {10e12, *PAPER_SIZES}
    if extra is not None:
        sizes.add(float(extra))
    return [(_size_label(n), n) for n in sorted(sizes)]


class MemoryCalculator:
    """What memory_calculator returns.

    Attributes:
        widget: the ipywidgets.VBox to display.
        controls: {"num_params", "world_size", "stage", "precision", "optimizer", "device_gb"}.
        figure: the matplotlib Figure drawn into the image.
        data: the last breakdown (stage_breakdown's list) and the "what fits" numbers.
        update(): redraw from the controls (called by every control change).
    """

    def __init__(self, bytes_per_parameter, model_state_bytes, max_num_params,
                 num_params=7.5e9, world_size=64, stage=1, device_gb=32.0):
        self._fns = (bytes_per_parameter, model_state_bytes, max_num_params)
        self.figure = Figure(figsize=(7.5, 4.2))
        self.data = {}
        try:
            import ipywidgets as w
        except ImportError:       # no widgets in this front end: draw once, for these values
            fixed = {"num_params": num_params, "world_size": world_size, "stage": stage,
                     "precision": "mixed", "optimizer": "adam", "device_gb": device_gb}
            self.controls = {k: types.SimpleNamespace(value=v) for k, v in fixed.items()}
            self.image, self.text = types.SimpleNamespace(value=b""), types.SimpleNamespace(value="")
            self.widget = _StaticView(self)
            self.update()
            return
        style = {"description_width": "150px"}
        layout = w.Layout(width="520px")
        self.controls = {
            # Named sizes, not a log slider: a log grid would snap 7.5B to 7.94B (10^9.9).
            "num_params": w.SelectionSlider(options=model_sizes(num_params), value=float(num_params),
                                            description="parameters Ψ", style=style,
                                            layout=layout),
            "world_size": w.SelectionSlider(options=[2 ** i for i in range(11)],
                                            value=world_size, description="ranks N",
                                            style=style, layout=layout),
            "stage": w.ToggleButtons(options=[(n, s) for s, n in enumerate(STAGE_NAMES)],
                                     value=stage, description="stage", style=style),
            "precision": w.Dropdown(options=["mixed", "fp32"], value="mixed",
                                    description="precision", style=style),
            "optimizer": w.Dropdown(options=["adam", "sgd_momentum", "sgd"], value="adam",
                                    description="optimizer", style=style),
            "device_gb": w.FloatSlider(value=device_gb, min=4, max=192, step=4,
                                       description="device memory (GB)", style=style,
                                       layout=layout),
        }
        self.image = w.Image(format="png")
        self.text = w.HTML()
        self.widget = w.VBox(list(self.controls.values()) + [self.text, self.image])
        for c in self.controls.values():
            c.observe(lambda change: self.update(), names="value")
        self.update()

    def update(self):
        bpp, msb, mnp = self._fns
        v = {k: c.value for k, c in self.controls.items()}
        device_bytes = v["device_gb"] * GB
        rows = stage_breakdown(bpp, msb, v["num_params"], v["world_size"], v["precision"],
                               v["optimizer"])
        fits = [mnp(device_bytes, v["world_size"], s, v["precision"], v["optimizer"])
                for s in range(4)]
        self.data = {"breakdown": rows, "max_num_params": fits, **v}
        self.figure.clear()
        ax = self.figure.add_subplot()
        draw_stages(ax, rows, device_bytes=device_bytes, highlight=v["stage"],
                    title=f"Ψ = {_size_label(v['num_params'])} parameters, N = {v['world_size']} ranks, "
                          f"{v['precision']} + {v['optimizer']}")
        self.figure.tight_layout()
        buf = io.BytesIO()
        self.figure.savefig(buf, format="png", dpi=80)
        self.image.value = buf.getvalue()
        s = v["stage"]
        total = rows[s]["total"]
        verdict = "✅ fits" if total <= device_bytes else "❌ does not fit"
        lines = [f"<b>{STAGE_NAMES[s]}</b>: one rank holds <b>{total / GB:.4g} GB</b> of model "
                 f"states: {verdict} in {v['device_gb']:g} GB.",
                 "Largest model whose model states fit: " + ", ".join(
                     f"{STAGE_NAMES[i]} {fits[i] / 1e9:.3g}B" for i in range(4)) + "."]
        if not all(r["consistent"] for r in rows):
            lines.append("⚠️ the bars do not add up to your model_state_bytes: does each stage "
                         "shard the right family (1: optimizer state, 2: + gradients, "
                         "3: + parameters)?")
        self.text.value = "<br>".join(lines)
        return self.data


class _StaticView:
    """What `display(calc.widget)` shows without ipywidgets: the text and figure, no controls."""

    def __init__(self, calc: MemoryCalculator):
        self.calc = calc

    def _repr_html_(self) -> str:
        png = base64.b64encode(self.calc.image.value).decode()
        return (f"<p><i>ipywidgets is not available here, so the calculator is drawn once for "
                f"these values (pip install ipywidgets for the sliders).</i></p>"
                f"<p>{self.calc.text.value}</p><img src='data:image/png;base64,{png}'/>")


def memory_calculator(bytes_per_parameter, model_state_bytes, max_num_params, **defaults):
    """An interactive per-rank memory calculator built on the learner's three functions.

    Args:
        bytes_per_parameter, model_state_bytes, max_num_params: the learner's functions.
        defaults: num_params, world_size, stage, device_gb (initial values of the controls).
    Returns:
        a MemoryCalculator: display(calc.widget); calc.update(); calc.data; calc.figure.
    """
    return MemoryCalculator(bytes_per_parameter, model_state_bytes, max_num_params, **defaults)


# --------------------------------------------------------------------------------------------------
# Fallbacks that read as information

def _reason(error: BaseException) -> str:
    """A short reason for a failed demo: "not written yet" for a stub, else the error's first line."""
    if isinstance(error, NotImplementedError) or "NotImplementedError" in str(error).split("\n", 1)[0]:
        return "not written yet"
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    return f"{type(error).__name__}: {first[:160]}" if first else type(error).__name__


def show_fallback(missing: str, instead: str, error: BaseException | None = None) -> str:
    """Say in one line what was not available and what is done instead; details behind a fold.

    For a demo cell that needs something the learner has not written yet (or that this machine
    lacks): the line reads as information, not as a crash, and the error's full text (a rank's
    traceback) sits behind a "details" fold in a notebook, or is left out of a plain console.

    Args:
        missing: what was not available, e.g. "the proof needs your dp_train_step".
        instead: what happens instead, e.g. "its figure is skipped until it runs".
        error: the exception that said so, if any (its first line becomes the reason).
    Returns:
        the line shown.
    """
    import html
    import traceback

    line = f"ℹ️ {missing}" + (f" ({_reason(error)})" if error is not None else "") + f": {instead}."
    try:
        from IPython import get_ipython
        from IPython.display import display
        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is None or error is None:
        print(line)
        return line
    details = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    display({"text/plain": line,
             "text/html": f"<p>{html.escape(line)}</p><details><summary>details</summary>"
                          f"<pre>{html.escape(details)}</pre></details>"}, raw=True)
    return line


# --------------------------------------------------------------------------------------------------
# The whole budget: model states + activations (notebook 08 closes 01's "what fits" with it)

def budget_breakdown(model_state_bytes, activation_bytes, num_params, world_size, n_layer, n_embd,
                     n_head, vocab_size, batch, seq_len, bytes_per_element=2):
    """Bytes ONE rank holds at stages 0..3 for a GPT: model states plus activations kept for
    backward, without and with activation checkpointing.

    Args:
        model_state_bytes: the learner's notebook-01 formula, model_state_bytes(Ψ, N, stage).
        activation_bytes: the learner's notebook-08 formula for ONE block,
            activation_bytes(batch, seq_len, n_embd, n_head, bytes_per_element).
        num_params, world_size: Ψ and N.
        n_layer, n_embd, n_head, vocab_size: the GPT's blocks L, width C, heads a, vocabulary V.
        batch, seq_len: B sequences of T tokens per rank (one micro-batch).
        bytes_per_element: b of the activations (2 for bf16).
    Returns:
        {"stages": [{"states", "without", "with"} per stage: bytes of model states and of
        activations], "block": one block's activations, "kept_inputs": what checkpointing keeps,
        "logits": the loss's fp32 log-probabilities}. Without checkpointing a rank keeps every
        block's activations; with it, each block's input, plus one block's activations while that
        block is recomputed in backward. Both add the logits, B·T·V numbers of 4 bytes.
    """
    block = activation_bytes(batch, seq_len, n_embd, n_head, bytes_per_element)
    kept_inputs = n_layer * batch * seq_len * n_embd * bytes_per_element   # (B, T, C) per block
    logits = batch * seq_len * vocab_size * 4                               # fp32 log-softmax
    without, with_ckpt = n_layer * block + logits, kept_inputs + block + logits
    stages = [{"states": float(model_state_bytes(num_params, world_size, s)), "without": without,
               "with": with_ckpt} for s in range(4)]
    return {"stages": stages, "block": block, "kept_inputs": kept_inputs, "logits": logits}


BUDGET_COLORS = {"states": "#1f77b4", "without": "#ff7f0e", "with": "#ffbb78"}


def draw_budget(ax, budget, device_bytes=None, title=None, unit=GB):
    """Two bars per stage (left: no checkpointing, right: checkpointing): model states, then
    activations on top, the total written above with ✅ (fits the device) or ❌.

    Args:
        ax: a matplotlib Axes.
        budget: budget_breakdown(...)'s dict.
        device_bytes: if given, a dashed line at the device's memory (and the ✅/❌ marks).
        title: the axes' title.
        unit: bytes per unit of the y axis (GB = 1e9).
    """
    labels = {"without": "activations, no checkpointing", "with": "activations, checkpointing"}
    for s, row in enumerate(budget["stages"]):
        for j, kind in enumerate(("without", "with")):
            x = s + 0.4 * j - 0.2
            ax.bar(x, row["states"] / unit, 0.38, color=BUDGET_COLORS["states"],
                   label="model states" if (s, j) == (0, 0) else None)
            ax.bar(x, row[kind] / unit, 0.38, bottom=row["states"] / unit, color=BUDGET_COLORS[kind],
                   label=labels[kind] if s == 0 else None)
            total = row["states"] + row[kind]
            mark = "" if device_bytes is None else (" ✅" if total <= device_bytes else " ❌")
            ax.annotate(f"{total / unit:.3g}{mark}", (x, total / unit), ha="center", va="bottom",
                        fontsize=7)
    if device_bytes is not None:
        ax.axhline(device_bytes / unit, color="crimson", linestyle="--",
                   label=f"device memory ({device_bytes / unit:g} GB)")
    ax.set_xticks(range(len(budget["stages"])), STAGE_NAMES[:len(budget["stages"])], rotation=10)
    ax.set_xlabel("ZeRO stage (left bar: no checkpointing, right bar: checkpointing)")
    ax.set_ylabel("bytes on one rank (GB)")
    ax.set_title(title or "model states + activations on one rank")
    ax.legend(loc="upper right", fontsize="small")
