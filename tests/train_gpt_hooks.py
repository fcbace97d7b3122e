"""Test hooks for ``transformer_course.train_gpt`` (the package ships none): installed by
monkeypatching the trainer's ``run`` module.

* ``pause_at="NAME:STEP"`` (e.g. ``ckpt.pt:4``): the save of NAME at STEP writes its complete
  temporary file, creates ``OUT_DIR/paused-in-save`` and sleeps, so that a test can kill the
  process at the most delicate moment of a save;
* ``rank_state=True``: after training every rank writes ``OUT_DIR/rank_state/rank<r>.json``
  with the SHA-256 of its final weights and of its first batch.

In a test process: ``install(monkeypatch.setattr, ...)``. In a subprocess (also under
torchrun), this file is the program: ``python tests/train_gpt_hooks.py [--pause NAME:STEP]
[--rank-state] train ...``.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

from transformer_course.checkpoint import state_dict_sha256
from transformer_course.train_gpt import cli, run

PAUSE_MARKER = "paused-in-save"


def install(setattr_, pause_at: str | None = None, rank_state: bool = False) -> None:
    if pause_at is not None:
        save = run.save_checkpoint

        def paused_save(path, *args, **kwargs):
            if f"{Path(path).name}:{kwargs['step']}" == pause_at:

                def pause(tmp: Path) -> None:
                    (Path(path).parent / PAUSE_MARKER).write_text(str(tmp))
                    time.sleep(3600)  # until the test kills the process

                kwargs["before_replace"] = pause
            return save(path, *args, **kwargs)

        setattr_(run, "save_checkpoint", paused_save)
    if rank_state:
        train = run.train

        def train_and_record(cfg):
            finished = train(cfg)
            _write_rank_state(finished)
            return finished

        setattr_(run, "train", train_and_record)


def _write_rank_state(r: run.Run) -> None:
    x, _ = run.step_batch(r, r.start_step, 0)
    state = {
        "rank": r.info.rank,
        "world_size": r.info.world_size,
        "start_step": r.start_step,
        "step": max(r.start_step, r.cfg.max_steps),
        "weights_sha256": state_dict_sha256(r.raw_model.state_dict()),
        "first_batch_sha256": hashlib.sha256(x.cpu().numpy().tobytes()).hexdigest(),
    }
    folder = r.cfg.out_dir / "rank_state"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank{r.info.rank}.json").write_text(json.dumps(state))


def main(argv: list[str]) -> int:
    pause_at, rank_state = None, False
    while argv and argv[0].startswith("--"):
        if argv[0] == "--pause":
            pause_at, argv = argv[1], argv[2:]
        elif argv[0] == "--rank-state":
            rank_state, argv = True, argv[1:]
        else:
            raise SystemExit(f"unknown hook option {argv[0]}")
    install(setattr, pause_at, rank_state)
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
