r"""Train a MiniGPT on the course corpus or your own text, nanoGPT style; sample it.

One CPU or one GPU (``--preset`` sizes the model and the run; see
:data:`~transformer_course.train_gpt.config.PRESETS`)::

    python -m transformer_course.train_gpt train --out-dir runs/gpt   # cpu-small
    python -m transformer_course.train_gpt train --preset gpu --out-dir runs/gpt-gpu
    python -m transformer_course.train_gpt sample --ckpt runs/gpt/ckpt.pt \
        --prompt "The fox" -n 300

Your own text (a UTF-8 file, or a folder of ``.txt``/``.md`` files), with characters or
a byte-level BPE; the book's Chinese prose with ``--preset zh``::

    python -m transformer_course.train_gpt train --data notes/ --tokenizer bpe \
        --vocab-size 2048 --out-dir runs/mine
    python -m transformer_course.train_gpt train --preset zh --out-dir runs/zh

The tokenizer and the text's SHA-256 are saved in the checkpoint; ``sample`` uses that
tokenizer, and ``--resume`` refuses other text or another tokenizer. Bad input (a
missing path, bytes that are not UTF-8, a binary file, empty text, a single paragraph,
text shorter than the context plus one) is refused with one line before anything is
written (:func:`.data.load_data`).

Several processes or GPUs (PyTorch DistributedDataParallel; gloo on CPU, nccl on GPU)::

    torchrun --standalone --nproc_per_node 4 -m transformer_course.train_gpt train \
        --out-dir runs/gpt

Resume an interrupted run (the step count, model and optimizer states continue)::

    python -m transformer_course.train_gpt train --out-dir runs/gpt --resume

The validation text is the last tenth of the corpus' paragraphs, whole paragraphs as in
chapter 5 (:func:`transformer_course.split_paragraphs`): each paragraph is one story,
so the validation loss is measured on stories the model never saw.

Nothing is lost when a run is killed, even with SIGKILL in the middle of a save:

* ``OUT_DIR/ckpt.pt`` (latest) and ``OUT_DIR/best.pt`` (lowest validation loss;
  weights only) are written to a temporary file, fsynced and renamed into place
  (``save_checkpoint``); a start removes the temporary files a killed save left behind;
* on ``--resume`` the model flags given on the command line must equal the
  checkpoint's config (only the flags you type are compared; leave them out to take
  the checkpoint's), and ``OUT_DIR/metrics.jsonl`` is cut back to the checkpoint's
  step, so a resumed run's log has every step exactly once and equals an uninterrupted
  run's; a resumed run ends with weights bitwise equal to an uninterrupted one (batches
  and dropout masks depend only on the seed, rank and step:
  :func:`transformer_course.derived_seed`);
* on ``--resume`` the learning-rate schedule (``--lr``, ``--min-lr``,
  ``--warmup-steps`` and the decay length, ``--lr-decay-steps`` or else
  ``--max-steps``) must be the checkpoint's: another ``--max-steps`` alone would
  reshape the cosine decay mid-run, so it is refused, naming both values; to train
  longer on the same schedule pass ``--lr-decay-steps`` with the checkpoint's length;
* a run without ``--resume`` refuses an OUT_DIR that already holds a checkpoint;
* every numeric flag is range-checked, and OUT_DIR must be writable, before any work
  starts; user errors exit with status 2 and one line ``PROG: 错误：...`` (every
  message a learner sees, like ``--help``, is Chinese; ``metrics.jsonl`` keys and file
  names stay English).

Every rank draws its own batches; DDP averages the gradients, so all replicas stay
identical, and the effective batch is ``batch_size * grad_accum * world_size``
sequences.
Checkpoints hold only tensors and plain Python values and are read back with
``torch.load(..., weights_only=True)`` (see ``transformer_course.checkpoint``).

Modules: :mod:`.cli` (the command line), :mod:`.config` (``TrainConfig``, presets,
resume-flag matching), :mod:`.data` (the text: read, checked, split, tokenized),
:mod:`.run` (model and the loop in named steps),
:mod:`.distributed` (process group and ranks), :mod:`.sample` (the ``sample`` command).
"""

from .cli import main

__all__ = ["main"]
