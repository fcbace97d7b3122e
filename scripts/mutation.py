#!/usr/bin/env python
"""Mutation testing of the package with mutmut: score and surviving mutants per module.

    python scripts/mutation.py --modules sampling training        # what `make mutation` runs
    python scripts/mutation.py --modules masks --tests tests/test_masks.py

mutmut (pinned in requirements-mutation.txt) copies the package into ``mutants/``, makes many
one-token changes ("mutants") to every function of the chosen modules, and runs the tests that
exercise each function against each mutant; a mutant the tests do not notice "survives".
This script works in a scratch copy of the repository (``OUT/work``: ``src``, ``tests``,
``scripts``, ``pyproject.toml`` with a generated ``[tool.mutmut]`` table), so the checkout is
never modified, and writes

* ``OUT/summary.json`` -- per module: counts, score and every survivor with its diff;
* ``OUT/summary.md``   -- the same as a table and a list, for reading;
* ``OUT/mutmut.log``   -- mutmut's own output.

Score = killed / (mutants - equivalent), where timeouts count as killed (mutmut's own
convention) and *equivalent* mutants are survivors listed in ``EQUIVALENT`` below: changes that
cannot alter any observable behaviour, each with the reason. A survivor that is not listed is a
missing test. The default tests are the unit tests (``tests/``) without the browser tests,
``tests/test_train_script.py`` (its subprocesses would import the unmutated package anyway) and
``tests/test_book_pages.py`` (it checks the book's pages, not the package).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "transformer_course"
DEFAULT_TESTS = ["tests"]
# browser tests need the built book; the train-script tests' subprocesses would import the unmutated
# package; the book-page and printed-code tests read book/ and the Makefile test the Makefile (neither
# is copied), and they exercise no package behaviour
IGNORED_TESTS = [
    "tests/browser",
    "tests/test_train_script.py",
    "tests/test_book_pages.py",
    "tests/test_printed_code.py",
    "tests/test_makefile.py",
]
# show_source prints the package's source, which mutmut rewrites (trampolines around every function);
DESELECTED_TESTS = [
    "tests/test_notebook.py::test_show_source_is_the_package_source",
    "tests/test_notebook.py::test_show_source_dedents_methods",
    # mutmut's trampolines (and its recording of which test runs which function) are Python
    # control flow that torch.compile cannot trace: the one-graph tests would fail for every mutant
    "tests/test_minigpt.py::test_gpt_forward_is_one_graph_without_host_sync",
    "tests/test_transformer.py::test_transformer_forward_is_one_graph_without_host_sync",
]

# Survivors that cannot change observable behaviour, as (module, function, mutated line exactly as
# `mutmut show` prints it, reason). Every other survivor found so far was a missing test and got one
# (e.g. `zero_grad(set_to_none=False)` in train_loop, once thought equivalent, is caught by
# tests/test_training.py::test_train_loop_sets_gradients_to_none_so_unused_parameters_stay_put).
_INF = 'float() parses "inf" case-insensitively: float("-INF") == float("-inf")'
_STACK_1D = "the stacked tensors are 1-D, so stacking on dim +1 and on dim -1 gives the same (d/2, 2) tensor"
_PERSISTENT = (
    "register_buffer tests `if persistent:`, so None acts like False (the `is False` check is for ScriptModule); "
    "persistent=True and leaving it out are killed by the state_dict tests"
)
_LINEAR_BIAS = "nn.Linear tests `if bias:`, so None acts like False"
EQUIVALENT: list[tuple[str, str, str, str]] = [
    ("models", "MiniGPT.__init__", "self.lm_head = nn.Linear(E, cfg.vocab_size, bias=None)", _LINEAR_BIAS),
    (
        "models",
        "MiniGPT.forward",
        "logits.flatten(0, 1), targets.flatten(), )",
        "IGNORE_INDEX is -100, F.cross_entropy's default ignore_index",
    ),
    (
        "models",
        "Transformer.__init__",
        "TransformerBlock(**layer_args, )",
        "causal=False is TransformerBlock's default",
    ),
    (
        "models",
        "Transformer.__init__",
        "TransformerBlock(**layer_args, causal=None)",
        "the block only tests `if is_causal` (MultiHeadAttention._mask gives the kernel a bool): None acts like False",
    ),
    (
        "attention",
        "masked_softmax",
        "weights = torch.softmax(scores.masked_fill(dead, 1.0), dim=-1)",
        "any finite fill works: fully masked rows are zeroed after the softmax, and masked_fill passes no gradient "
        "to the filled positions",
    ),
    (
        "attention",
        "AdditiveAttention.__init__",
        "self.w_query = nn.Linear(query_dim, hidden_dim, bias=None)",
        _LINEAR_BIAS,
    ),  # fmt: skip
    ("attention", "AdditiveAttention.__init__", "self.v = nn.Linear(hidden_dim, 1, bias=None)", _LINEAR_BIAS),
    (
        "attention",
        "AdditiveAttention.__init__",
        "self.w_key = nn.Linear(key_dim, hidden_dim, )",
        "bias=True is nn.Linear's default; kept explicit to show which layer has the bias",
    ),
    (
        "attention",
        "MultiHeadAttention._mask",
        "check_mask(attn_mask, (N, H, L, S), check_values=None)",
        "check_mask tests `if check_values and ...`, so None acts like False",
    ),
    ("masks", "bool_to_additive", 'return out.masked_fill(~mask, float("-INF"))', _INF),
    ("masks", "merge_masks", 'return attn_mask.masked_fill(~structural, float("-INF"))', _INF),
    (
        "positional",
        "relative_position_transform",
        "blocks = torch.stack([torch.stack([c, s], +1), torch.stack([-s, c], -1)], -2)",
        _STACK_1D,
    ),
    (
        "positional",
        "relative_position_transform",
        "blocks = torch.stack([torch.stack([c, s], -1), torch.stack([-s, c], +1)], -2)",
        _STACK_1D,
    ),
    (
        "positional",
        "RotaryEmbedding.__init__",
        'self.register_buffer("cos", angles.cos().float(), persistent=None)',
        _PERSISTENT,
    ),
    (
        "positional",
        "RotaryEmbedding.__init__",
        'self.register_buffer("sin", angles.sin().float(), persistent=None)',
        _PERSISTENT,
    ),  # fmt: skip
    (
        "positional",
        "SinusoidalPositionalEncoding.__init__",
        '"pe", sinusoidal_table(max_len, d_model, base), persistent=None',
        _PERSISTENT,
    ),
    (
        "training",
        "cosine_lr",
        "if step > decay_steps:",
        "at step == decay_steps the cosine branch gives min_lr + 0.5 * (1 + cos(pi)) * (lr - min_lr), "
        "and cos(pi) is exactly -1.0 in floating point: the same min_lr",
    ),
    (
        "training",
        "cosine_lr",
        "progress = (step - warmup) / max(2, decay_steps - warmup)",
        "the divisor differs only when decay_steps - warmup <= 1, and then the only step that reaches the "
        "cosine branch is step == warmup, where progress is 0 either way",
    ),
    (
        "training",
        "derived_seed",
        "return int.from_bytes(hashlib.sha256(key).digest()[:8], )",
        'int.from_bytes defaults to byteorder="big" since Python 3.11 (the package requires >= 3.11)',
    ),
]


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", nargs="+", required=True, help=f"module names of {PACKAGE}, e.g. sampling")
    parser.add_argument("--tests", nargs="+", default=DEFAULT_TESTS, help="test files or folders (default: tests)")
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested in parallel (default 2)")
    parser.add_argument("--out", type=Path, default=ROOT / "_build" / "mutation", help="output folder")
    parser.add_argument(
        "--summarize-only", action="store_true", help="do not run mutmut; summarise the results already in OUT/work"
    )
    args = parser.parse_args(argv)
    if args.jobs <= 0:
        parser.error(f"--jobs must be positive, got {args.jobs}")
    for name in args.modules:
        if not (ROOT / "src" / PACKAGE / f"{name}.py").is_file():
            parser.error(f"--modules: no module src/{PACKAGE}/{name}.py (got {name!r})")
    for path in args.tests:
        if not (ROOT / path).exists():
            parser.error(f"--tests: {path!r} does not exist")
    return args


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def _prepare(work: Path, modules: list[str], tests: list[str]) -> None:
    """A scratch copy of the repository with a [tool.mutmut] table for these modules and tests."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    for folder in ("src", "tests", "scripts"):
        shutil.copytree(ROOT / folder, work / folder, ignore=ignore)
    pyproject = (ROOT / "pyproject.toml").read_text()
    if "[tool.mutmut]" in pyproject:
        raise SystemExit("pyproject.toml has a [tool.mutmut] table; scripts/mutation.py writes its own")
    ignores = [f"--ignore={p}" for p in IGNORED_TESTS] + [f"--deselect={t}" for t in DESELECTED_TESTS]
    pyproject += (
        "\n[tool.mutmut]\n"
        'source_paths = ["src"]\n'
        f"only_mutate = {_toml_list([f'src/{PACKAGE}/{m}.py' for m in modules])}\n"
        'also_copy = ["scripts"]\n'
        f"pytest_add_cli_args = {_toml_list(['-p', 'no:cacheprovider', *ignores])}\n"
        f"pytest_add_cli_args_test_selection = {_toml_list(tests)}\n"
    )
    (work / "pyproject.toml").write_text(pyproject)


def _changed_lines(diff: str) -> tuple[list[str], list[str]]:
    removed = [line[1:].strip() for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    return removed, added


def _function_of(mutant: str) -> str:
    """``pkg.mod.x_func__mutmut_3`` -> ``func``; ``pkg.mod.xǁClassǁmethod__mutmut_3`` -> ``Class.method``."""
    mangled = mutant.rsplit("__mutmut_", 1)[0].rsplit(".", 1)[1]
    if mangled.startswith("xǁ"):
        return mangled[2:].replace("ǁ", ".")
    return mangled.removeprefix("x_")


def _equivalence_reason(module: str, function: str, added: list[str]) -> str | None:
    for mod, func, line, reason in EQUIVALENT:
        if mod == module and func == function and line in added:
            return reason
    return None


# Run in OUT/work (mutmut reads its configuration from the current folder): the diffs of the
# mutants named on stdin, as JSON; one process for all survivors instead of one `mutmut show` each.
_DIFFS = """
import json, sys
from mutmut.mutation.diff_apply import find_mutant, get_diff_for_mutant
names = json.load(sys.stdin)
print(json.dumps({name: get_diff_for_mutant(name, path=find_mutant(name).path) for name in names}))
"""


def _collect(work: Path, modules: list[str], env: dict[str, str]) -> dict[str, dict]:
    from mutmut.stats import status_by_exit_code

    codes_by_module = {}
    for module in modules:
        meta = work / "mutants" / "src" / PACKAGE / f"{module}.py.meta"
        codes_by_module[module] = json.loads(meta.read_text())["exit_code_by_key"] if meta.is_file() else {}
    unkilled = [
        name
        for codes in codes_by_module.values()
        for name, code in codes.items()
        if status_by_exit_code[code] in ("survived", "no tests")
    ]
    diffs = json.loads(
        subprocess.run(
            [sys.executable, "-c", _DIFFS], cwd=work, env=env, input=json.dumps(unkilled),
            capture_output=True, text=True, check=True,
        ).stdout
    )  # fmt: skip
    summary = {}
    for module, codes in codes_by_module.items():
        counts: dict[str, int] = {}
        survivors = []
        for name, code in sorted(codes.items(), key=lambda kv: (kv[0].rsplit("_", 1)[0], int(kv[0].rsplit("_", 1)[1]))):
            status = status_by_exit_code[code]
            if status == "survived" or status == "no tests":
                removed, added = _changed_lines(diffs[name])
                function = _function_of(name)
                reason = _equivalence_reason(module, function, added)
                if reason is not None:
                    status = "equivalent"
                survivors.append(
                    {"name": name, "status": status, "original": removed, "mutant": added, "reason": reason}
                )
            counts[status] = counts.get(status, 0) + 1
        killed = counts.get("killed", 0) + counts.get("timeout", 0)
        scored = len(codes) - counts.get("equivalent", 0) - counts.get("skipped", 0)
        summary[module] = {
            "mutants": len(codes),
            "counts": counts,
            "killed": killed,
            "score": round(100.0 * killed / scored, 1) if scored else None,
            "survivors": survivors,
        }
    return summary


def _markdown(summary: dict[str, dict], tests: list[str], seconds: float) -> str:
    lines = [
        "# Mutation testing (mutmut)",
        "",
        f"Tests: `{' '.join(tests)}` (ignoring {', '.join(IGNORED_TESTS + DESELECTED_TESTS)}); "
        + (f"mutmut run: {seconds:.0f} s." if seconds else "summarised from an earlier run."),
        "Score = killed (timeouts included) / (mutants - equivalent).",
        "",
        "| module | mutants | killed | survived | no tests | equivalent | score |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for module, s in summary.items():
        c = s["counts"]
        lines.append(
            f"| {module} | {s['mutants']} | {s['killed']} | {c.get('survived', 0)} | {c.get('no tests', 0)} "
            f"| {c.get('equivalent', 0)} | {s['score']}% |"
        )
    for module, s in summary.items():
        if s["survivors"]:
            lines += ["", f"## {module}: survivors", ""]
            for m in s["survivors"]:
                change = f"`{' / '.join(m['original'])}` -> `{' / '.join(m['mutant'])}`"
                tail = f" (equivalent: {m['reason']})" if m["reason"] else ""
                lines.append(f"- {m['status']}: {m['name']}: {change}{tail}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    out: Path = args.out.resolve()
    work = out / "work"
    if not args.summarize_only:
        _prepare(work, args.modules, args.tests)
    mutmut = shutil.which("mutmut", path=str(Path(sys.executable).parent)) or shutil.which("mutmut")
    if mutmut is None:
        raise SystemExit("mutmut is not installed: pip install -r requirements-mutation.txt")
    # PYTHONPATH would put the unmutated src/ ahead of mutmut's copy
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.setdefault("OMP_NUM_THREADS", "1")
    log = out / "mutmut.log"
    seconds = 0.0
    if not args.summarize_only:
        start = time.perf_counter()
        with log.open("w") as f:
            proc = subprocess.run(
                [mutmut, "run", "--max-children", str(args.jobs)], cwd=work, env=env, stdout=f, stderr=f
            )
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            print(log.read_text()[-3000:], file=sys.stderr)
            raise SystemExit(f"mutmut run failed with exit code {proc.returncode}; see {log}")
    summary = _collect(work, args.modules, env)
    (out / "summary.json").write_text(
        json.dumps({"tests": args.tests, "seconds": round(seconds, 1), "modules": summary}, indent=2) + "\n"
    )
    report = _markdown(summary, args.tests, seconds)
    (out / "summary.md").write_text(report)
    print(report)
    print(f"written: {out / 'summary.json'}, {out / 'summary.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
