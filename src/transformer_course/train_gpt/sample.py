"""The ``sample`` command: text from a checkpoint written by ``train``."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import transformer_course as tc

from .config import UsageError, read_checkpoint, saved_model_config
from .data import tokenizer_from_extra
from .distributed import DistInfo, pick_device


def sample(
    ckpt: str | Path,
    *,
    prompt: str | None = None,
    max_new_tokens: int = 300,
    num_samples: int = 1,
    temperature: float = 0.8,
    top_k: int | None = None,
    top_p: float | None = None,
    greedy: bool = False,
    seed: int = 0,
    device: str = "auto",
) -> int:
    """Print ``num_samples`` continuations of ``prompt`` (default: a newline): the whole
    prompt, then the new text. A prompt longer than the context window is not cropped in
    the output; the model sees its last ``context_length`` tokens, and a note on stderr
    says so."""
    dev = pick_device(device, DistInfo())
    state = read_checkpoint(Path(ckpt), "--ckpt")  # weights_only=True inside
    cfg = saved_model_config(state, "--ckpt")
    tok = tokenizer_from_extra(state["extra"])
    model = tc.MiniGPT(cfg)
    model.load_state_dict(state["model"])
    model.to(dev).eval()
    prompt_ids = encode_prompt(tok, prompt)
    ids = torch.tensor([prompt_ids] * num_samples, dtype=torch.long, device=dev)
    if len(prompt_ids) > cfg.context_length:
        print(
            f"注意：提示有 {len(prompt_ids)} 个词元，超过检查点的上下文长度 "
            f"{cfg.context_length}；模型只看得到提示的最后 {cfg.context_length} 个词元"
            "（下面照样打印完整的提示）",
            file=sys.stderr,
        )
    gen = torch.Generator(device=dev).manual_seed(seed)
    out = model.generate(
        ids,
        max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        greedy=greedy,
        generator=gen,
    )
    for i, row in enumerate(out.tolist()):
        if num_samples > 1:
            print(f"----- 样本 {i + 1}/{num_samples}（检查点第 {state['step']} 步）")
        print(tok.decode(row), flush=True)
    return 0


def encode_prompt(tok: tc.CharTokenizer | tc.BPETokenizer, prompt: str | None) -> list:
    """The prompt's ids (default: a newline, or a character tokenizer's first
    character if it has none); a character tokenizer refuses unknown characters."""
    if isinstance(tok, tc.BPETokenizer):
        prompt = "\n" if prompt is None else prompt
        unknown = []
    else:
        if prompt is None:
            prompt = "\n" if "\n" in tok.chars else tok.chars[0]
        unknown = sorted(set(prompt) - set(tok.chars))
    if not prompt:
        raise UsageError("--prompt 不能是空的")
    if unknown:
        raise UsageError(
            f"--prompt {prompt!r} 里有训练文本中没有的字符 {unknown}；"
            "字符分词器只认识训练文本里出现过的字符"
        )
    return tok.encode(prompt)
