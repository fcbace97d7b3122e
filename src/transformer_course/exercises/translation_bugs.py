"""Bugs of chapter 1's translation model that training does not reveal: the decoder's
input and labels built from the target sentence (teacher forcing). With unshifted
targets the training loss falls to about 0, yet greedy decoding fails: the decoder
learned to copy its input."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
from torch import Tensor

from ._protocol import Skeleton, checker, fail, name_of, run_learner, seeded_generator
from ._report import (
    as_tensor,
    bug_hunt_hints,
    check_shape,
    first_reproduced,
    where_differs,
)

_PAD, _BOS, _EOS = 0, 1, 2
IGNORE = -100  # the label F.cross_entropy skips

# typical mistakes, first match wins: (hint, mistake)
DECODER_BATCH_HINTS = [
    (
        "标签和解码器输入是同一个序列：位置 t 的答案就在它自己的输入里，"
        "因果掩码又允许它看自己，模型只要照抄，训练损失降到接近 0；"
        "解码时输入只有 <bos>，它就只会抄出 <bos>。"
        "输入 tgt[:, :-1]，标签 tgt[:, 1:]。",
        "copy",
    ),
    (
        "右移的方向反了：解码器输入要以 <bos> 开头（tgt[:, :-1]），"
        "标签要以第一个词开头、以 <eos> 结尾（tgt[:, 1:]）。",
        "reversed",
    ),
    (
        "填充位置也当成了要预测的标签：把标签里的 pad_id 换成 -100"
        "（labels.masked_fill(labels == pad_id, -100)）。",
        "pad_kept",
    ),
    (
        "输入里的填充也被换掉了：只有标签要换成 -100；"
        "解码器输入必须是合法的词元编号（-100 查不了嵌入表）。",
        "input_masked",
    ),
    (
        "标签对了，解码器输入却也右移了：输入应以 <bos> 开头，是 tgt[:, :-1]，"
        "不是 tgt[:, 1:]（那样位置 t 的输入就是它要预测的答案）。",
        "input_shifted",
    ),
    (
        "-100 放错了位置：你按解码器输入里的填充去换标签，两者错开一位，"
        "输入是 <eos> 的那个位置的标签是填充，却没有被换掉。要看标签自己："
        "labels.masked_fill(labels == pad_id, -100)。",
        "mask_from_input",
    ),
    (
        "<eos> 也换成了 -100：只有填充换成 -100。<eos> 是真正的目标，模型要学会在"
        "句末输出它，解码才停得下来（labels.masked_fill(labels == pad_id, -100)）。",
        "eos_masked",
    ),
    (
        "解码器输入没有去掉最后一个词元：dec_in 是整个 tgt，比标签长一列。"
        "位置 t 的输入对应位置 t 的标签（下一个词）；最后一个词元之后没有要预测的词，"
        "它不该出现在输入里。",
        "input_full",
    ),
    (
        "两个返回值的顺序反了：两者都算对了，应返回 (dec_in, labels)，"
        "解码器输入在前、标签（含 -100）在后。",
        "pair_swapped",
    ),
    (
        "标签是用 torch.roll 移出来的：roll 是循环移位，最后一列绕回成了 "
        "dec_in 的第一列 <bos>，而不是 tgt 的最后一个词元。用切片：labels = tgt[:, 1:]"
        "（再把 pad_id 换成 -100）。",
        "rolled",
    ),
    (
        "标签右移了两位：位置 t 的输入是 tgt[:, t]，标签应是紧跟着的 tgt[:, t+1]，"
        "你用的是 tgt[:, t+2]（每个位置都要跳过一个词预测，第一个词永远不是标签）。"
        "labels = tgt[:, 1:]，再把 pad_id 换成 -100。",
        "shifted_two",
    ),
]


# the find-the-bug exercise on this checker (chapter 1): the page's labels are the
# decoder input itself; the hint gives the symptom and where to look
_BUG_HUNT = {
    "1.9": {
        "copy": (
            "训练损失几乎为 0、却一个词也译不出，正是这个症状：位置 t 要预测的词，"
            "模型在它自己的输入里就看得见。把标签和解码器输入逐位置比一比，"
            "看标签是从 tgt 的哪一段切出来的。"
        )
    }
}


def _batch(g: torch.Generator) -> Tensor:
    """Targets ``BOS w1 … wn EOS``, right-padded, of several lengths."""
    lengths = [5, 2, 3]  # words between BOS and EOS
    tgt = torch.full((3, 7), _PAD, dtype=torch.long)
    for b, n in enumerate(lengths):
        tgt[b, 0], tgt[b, n + 1] = _BOS, _EOS
        tgt[b, 1 : n + 1] = torch.randint(3, 12, (n,), generator=g)
    return tgt


def _batch_variant(tgt: Tensor, pad_id: int, mistake: str) -> tuple[Tensor, Tensor]:
    """``(decoder input, labels)`` as built right, or with one typical mistake."""
    dec_in, labels = tgt[:, :-1], tgt[:, 1:]
    if mistake == "copy":
        labels = dec_in
    elif mistake == "rolled":  # a cyclic shift: the last label wraps round to BOS
        labels = torch.roll(dec_in, -1, 1)
    elif mistake == "reversed":
        dec_in, labels = labels, dec_in
    elif mistake == "shifted_two":  # tgt[:, 2:], padded back to T-1 columns
        labels = torch.cat([tgt[:, 2:], torch.full_like(tgt[:, :1], pad_id)], 1)
    dec_in = {"input_shifted": tgt[:, 1:], "input_full": tgt}.get(mistake, dec_in)
    if mistake == "mask_from_input":
        labels = labels.masked_fill(dec_in == pad_id, IGNORE)
    elif mistake != "pad_kept":
        labels = labels.masked_fill(labels == pad_id, IGNORE)
    if mistake == "eos_masked":
        labels = labels.masked_fill(labels == _EOS, IGNORE)
    if mistake == "input_masked":
        dec_in = dec_in.masked_fill(dec_in == pad_id, IGNORE)
    if mistake == "pair_swapped":
        return labels, dec_in
    return dec_in, labels


def fail_if_tgt_edited(
    given: Tensor, tgt: Tensor, name: str, case: str, crash: str = ""
) -> None:
    """Fail if the learner's code changed ``given`` (its copy of ``tgt``) in place: the
    labels ``tgt[:, 1:]`` are a view of ``tgt``, so an in-place ``-100`` reaches the
    decoder input ``tgt[:, :-1]`` too. ``crash``: the learner's later error, if any."""
    if torch.equal(given, tgt):
        return
    fail(
        f"{name} 原地修改了传进来的 tgt（{case}）：labels = tgt[:, 1:] 是 tgt "
        "的视图（共用同一块内存），labels[labels == pad_id] = -100 也就改了 "
        "tgt，解码器输入 tgt[:, :-1] 里于是有了 -100（查嵌入表时下标越界，"
        "IndexError: index out of range），调用者的 tgt 也坏了。用返回新张量"
        "的写法：labels = tgt[:, 1:].masked_fill(tgt[:, 1:] == pad_id, -100)"
        "，或先 tgt[:, 1:].clone()。"
        + (f"\n（你的代码随后出错：{crash}）" if crash else "")
    )


def _joined(dec_in: Tensor, labels: Tensor) -> Tensor:
    return torch.cat([dec_in.flatten(), labels.flatten()]).double()


@checker("解码器的输入与标签（教师强制）")
def check_decoder_batch(fn: Callable, exercise: str | None = None) -> str:
    """Grade ``fn(tgt, pad_id) -> (dec_in, labels)``: ``tgt`` ``(N, T)`` is
    ``BOS w1 … wn EOS`` right-padded with ``pad_id``; the decoder input is
    ``tgt[:, :-1]`` and the labels ``tgt[:, 1:]`` with ``pad_id`` replaced by ``-100``.
    Both ``(N, T-1)`` integer tensors."""
    name = name_of(fn)
    g = seeded_generator(41)
    hints = bug_hunt_hints(DECODER_BATCH_HINTS, exercise, _BUG_HUNT)
    for i, pad_id in enumerate((_PAD, 12)):
        case = f"第 {i + 1} 个批次（pad_id = {pad_id}）"
        tgt = _batch(g)
        tgt[tgt == _PAD] = pad_id
        given = tgt.clone()  # the learner's own copy: an in-place edit shows
        out = run_learner(
            fn, given, pad_id, what=name, case=case, first=i == 0, copy_inputs=False
        )
        fail_if_tgt_edited(given, tgt, name, case)
        if not (isinstance(out, tuple | list) and len(out) == 2):
            fail(
                f"{name} 应返回两个张量 (dec_in, labels)，"
                f"得到 {type(out).__name__}（{case}）。"
            )
        dec_in, labels = (as_tensor(t, name, case) for t in out)
        want_in, want_labels = _batch_variant(tgt, pad_id, "right")
        hint = first_reproduced(
            _joined(dec_in, labels),
            hints,
            lambda m, tgt=tgt, pad_id=pad_id: _joined(*_batch_variant(tgt, pad_id, m)),
        )
        if hint:
            fail(f"{name} 的输出不对（{case}）：{hint}")
        for got, want, what in (
            (dec_in, want_in, "dec_in"),
            (labels, want_labels, "labels"),
        ):
            check_shape(got, tuple(want.shape), f"{name} 返回的 {what}")
            if got.is_floating_point():
                fail(
                    f"{name} 返回的 {what} 应是整数（词元编号），"
                    f"得到 {got.dtype}（{case}）。"
                )
            if got.dtype != torch.long:
                fail(
                    f"{name} 返回的 {what} 是 {got.dtype}，应是 torch.long（int64，"
                    f"{case}）：训练时模型的嵌入层要 int64 的 tgt，"
                    "tc.label_smoothing_loss 和 F.cross_entropy 要 int64 的标签。"
                    "去掉 .int() / .to(torch.int32)：切片和 masked_fill "
                    "本身就保持 int64。"
                )
            if not torch.equal(got, want):
                fail(
                    f"{name} 返回的 {what} 不对（{case}）：{where_differs(got, want)}。"
                )
    return "2 个批次；输入以 <bos> 开头、标签右移一位、填充换成 -100"


@checker("去掉位置编码的翻译模型", values=("net", "src"))
def check_order_blind_translator(net: object, src: object) -> str:
    """Grade a trained translation model without positional encodings, ``net``, on one
    source sentence ``src`` (``(1, S)`` token ids, 2 ≤ S ≤ 6): in eval mode, every
    order of the source words gives the same logits (any decoder input), so every
    order gets the same translation."""
    missing = [n for n, v in (("net", net), ("src", src)) if v is None]
    if missing:
        raise Skeleton("、".join(missing), "还是 None")
    if isinstance(net, tuple):
        fail("net 是 (模型, 训练记录) 这一对：取 train_translator(...)[0]。")
    if not isinstance(net, torch.nn.Module):
        fail(
            f"net 应是训练好的模型（train_translator(...) 返回值的第一项），得到 "
            f"{type(net).__name__}（{net!r:.60}）。"
        )
    src = as_tensor(src, "src", "源句")
    if src.dim() != 2 or src.size(0) != 1 or not 2 <= src.size(1) <= 6:
        fail(
            "src 应是一个源句的词元编号，形状 (1, S)、2 ≤ S ≤ 6，"
            f"得到 {tuple(src.shape)}。"
        )
    if net.training:
        fail(
            "模型处在训练状态，dropout 让每次输出都不同：先 net.eval()"
            "（train_translator 返回的模型已经是 eval 状态）。"
        )
    dec_in = torch.tensor([[_BOS, _EOS + 2, _EOS + 3]])  # <bos> 和两个普通词元
    orders = list(itertools.permutations(range(src.size(1))))
    with torch.no_grad():
        ref = net(src, dec_in)
        gap = max(
            float((net(src[:, list(o)], dec_in) - ref).abs().max()) for o in orders
        )
    if gap > 1e-4 * max(1.0, float(ref.abs().max())):
        fail(
            f"换了源句的词序，输出就变了（{len(orders)} 种词序的 logits "
            f"最多相差 {gap:.3g}）："
            "这个模型还带着位置编码。用 train_translator(run, positional=False) 训练。"
        )
    return f"源句 {len(orders)} 种词序给出相同的 logits，译文必然相同"
