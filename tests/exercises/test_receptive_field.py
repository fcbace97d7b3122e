"""check_receptive_field (exercise 4.16): boolean products of the window mask, however
written, pass; the closed formula and each counting slip get their hints."""

import numpy as np
import pytest
import torch

import transformer_course as tc
from transformer_course.exercises import check_receptive_field, receptive_field

from .support import assert_passes, assert_rejects, assert_skeleton, rejection


def stacked(layers_done=lambda layers: layers, product="@", start="eye", count="last row"):
    def fn(L, n_w, layers):
        band = tc.causal_mask(L, window=n_w + 1).float()
        reach = torch.ones(L, L) if start == "ones" else torch.eye(L)
        for _ in range(layers_done(layers)):
            reach = ((band @ reach if product == "@" else band * reach) > 0).float()
        return int(reach.sum() if count == "all" else reach[-1].sum())

    return fn


def vector(L, n_w, layers):  # right: one row pushed through the mask (learner test 58)
    band = tc.causal_mask(L, window=n_w + 1)
    reach = torch.zeros(L, dtype=torch.bool)
    reach[-1] = True
    for _ in range(layers):
        reach = (reach.float() @ band.float()) > 0
    return int(reach.sum())


def power(L, n_w, layers):  # right
    band = tc.causal_mask(L, window=n_w + 1).double()  # float64 holds 3^130
    return torch.linalg.matrix_power(band, layers)[-1].count_nonzero().item()


def einsum_tensor(L, n_w, layers):  # right, returns a 0-d tensor
    band, reach = tc.causal_mask(L, window=n_w + 1).double(), torch.eye(L, dtype=torch.float64)
    for _ in range(layers):
        reach = torch.einsum("ij,jk->ik", reach, band).sign()
    return reach[-1].sum()


def by_tensordot(L, n_w, layers):  # right (learner test 59: was "no product")
    band = tc.causal_mask(L, window=n_w + 1).float()
    reach = torch.eye(L)
    for _ in range(layers):
        reach = (torch.tensordot(band, reach, dims=1) > 0).float()
    return int(reach[-1].sum())


def boolean_product(L, n_w, layers):  # right (learner test 59): (M[:, :, None] & R).any(1)
    band = tc.causal_mask(L, window=n_w + 1)
    reach = torch.eye(L, dtype=torch.bool)
    for _ in range(layers):
        reach = (band[:, :, None] & reach[None]).any(1)
    return int(reach[-1].sum())


def counted_in(dtype, test="> 0"):  # path counts in dtype, thresholded only at the end
    def fn(L, n_w, layers):
        band = tc.causal_mask(L, window=n_w + 1).to(dtype)
        reach = band
        for _ in range(layers - 1):
            reach = reach @ band
        return int(((reach[-1] > 0) if test == "> 0" else (reach[-1] != 0)).sum())

    return fn


# counts that fit (float64 holds the 3^130 of the deepest case; it only rounds) are right
WIDE_ENOUGH = [counted_in(torch.float64)]


def vector_and(L, n_w, layers):  # learner test 66: a reach vector, a broadcast product
    band = tc.causal_mask(L, window=n_w + 1)
    e = torch.zeros(L, dtype=torch.bool)
    e[-1] = True
    for _ in range(layers):
        e = (e[:, None] & band).any(0)
    return int(e.sum())


def vector_mul(L, n_w, layers):  # learner test 66
    band = tc.causal_mask(L, window=n_w + 1).float()
    e = torch.zeros(L)
    e[-1] = 1
    for _ in range(layers):
        e = ((e[:, None] * band).sum(0) > 0).float()
    return int(e.sum())


def by_mv(L, n_w, layers):  # learner test 66: torch.mv was not seen as a product
    band = tc.causal_mask(L, window=n_w + 1).float()
    e = torch.zeros(L)
    e[-1] = 1
    for _ in range(layers):
        e = torch.mv(band.T, e).clamp(max=1)
    return int(e.sum())


def in_numpy(L, n_w, layers):  # learner test 66: numpy products are trusted
    band = tc.causal_mask(L, window=n_w + 1).numpy().astype(int)
    reach = np.eye(L, dtype=int)
    for _ in range(layers):
        reach = ((band @ reach) > 0).astype(int)
    return int(reach[-1].sum())


@pytest.mark.parametrize(
    "right",
    [
        stacked(),
        vector,
        power,
        einsum_tensor,
        by_tensordot,
        boolean_product,
        *WIDE_ENOUGH,
        vector_and,
        vector_mul,
        by_mv,
        in_numpy,
    ],
)
def test_right_answers_pass(right, capsys):
    assert_passes(check_receptive_field, right, capsys)


def test_skeleton(capsys):
    assert_skeleton(check_receptive_field, lambda L, n_w, layers: None, capsys)


def formula(L, n_w, layers):
    return min(layers * n_w + 1, L)


def path_counts(L, n_w, layers):
    band = tc.causal_mask(L, window=n_w + 1).double()
    return int(torch.linalg.matrix_power(band, layers)[-1].sum())


def mask_then_formula(L, n_w, layers):  # builds the mask, then returns the formula
    _ = tc.causal_mask(L, window=n_w + 1)
    return min(layers * n_w + 1, L)


def transposed(L, n_w, layers):
    band = tc.causal_mask(L, window=n_w + 1).float().T
    reach = torch.eye(L)
    for _ in range(layers):
        reach = ((band @ reach) > 0).float()
    return int(reach[-1].sum())


def narrow_window(L, n_w, layers):
    return stacked()(L, n_w - 1, layers)


def wide_window(L, n_w, layers):  # learner test 64: window=n_w + 2
    return stacked()(L, n_w + 1, layers)


def unclipped(L, n_w, layers):
    band = torch.ones(L, L)  # no mask product clips at L: reads as the formula unclipped
    _ = band @ band
    return layers * n_w + 1


def one_short(L, n_w, layers):  # min(ℓ n_w, L): the position itself left out
    reach = stacked()(L, n_w, layers)
    return reach if reach == L else reach - 1


@pytest.mark.parametrize(
    ("answer", "keyword"),
    [
        (formula, "没有做 (L, L) 掩码矩阵的乘积"),
        (
            mask_then_formula,
            "没有做 (L, L) 掩码矩阵的乘积",
        ),  # learner test 60: it passed  # learner test 58: the closed formula passed
        (stacked(lambda n: n - 1), "少算了一层"),  # learner test 58: got the generic hint
        (stacked(lambda n: n + 1), "多算了一层"),
        (stacked(lambda n: 1), "只算了一层"),
        (stacked(count="all"), "所有位置的感受野之和"),  # learner test 25b
        (stacked(product="*", start="ones"), "逐元素的"),  # learner test 30b
        (stacked(product="*", start="eye"), "逐元素的"),
        (path_counts, "没有取 > 0"),
        (transposed, "不要转置"),
        (narrow_window, "窗口小了 1"),
        (wide_window, "窗口大了 1"),
        (unclipped, "超过了序列长度"),
        (one_short, "每个位置也看它自己"),
        (stacked(lambda n: n - 1, count="all"), "最后一行有几个 True"),  # the general hint
    ],
)
def test_each_mistake_gets_its_hint(answer, keyword, capsys):
    assert_rejects(check_receptive_field, answer, keyword, capsys)


@pytest.mark.parametrize(
    ("dtype", "test", "keyword"),
    [
        (torch.uint8, "> 0", "torch.uint8，它只能存 0～255"),  # learner test 61: it passed
        (torch.uint8, "!= 0", "按 2^8 取模"),
        (torch.int8, "!= 0", "torch.int8，它只能存 -128～127"),  # learner test 61: it passed
        (torch.int8, "> 0", "可能变成 0 或负数"),
        (torch.int16, "> 0", "torch.int16"),
        # learner test 61: inf and nan got the general hint
        (torch.float16, "> 0", "torch.float16，它最大只能存 65504"),
        (torch.float16, "!= 0", "nan != 0 却是 True"),
        # learner test 65: int64 and float32 counts passed; (40, 3, 40), (64, 2, 130) wrap them
        (torch.int32, "> 0", "torch.int32"),
        (torch.int64, "> 0", "torch.int64"),
        (torch.float32, "> 0", "torch.float32"),
        (torch.bfloat16, "> 0", "torch.bfloat16"),
    ],
)
def test_path_counts_that_overflow_are_named(dtype, test, keyword, capsys):
    message = rejection(check_receptive_field, counted_in(dtype, test))
    assert "路径条数溢出了" in message and keyword in message, message
    assert "每乘一次就取 > 0" in message and "用哪种 dtype 都不会溢出" in message, message
    assert "✓" not in capsys.readouterr().out


def test_a_count_that_became_nan_before_int_is_named_as_overflow(capsys):  # learner test 66
    def nan_to_int(L, n_w, layers):
        band = tc.causal_mask(L, window=n_w + 1).float()
        reach = band
        for _ in range(layers - 1):
            reach = reach @ band
        return int(reach[-1].sum()) and int((reach[-1] > 0).sum())

    message = rejection(check_receptive_field, nan_to_int)
    assert "路径条数溢出了" in message and "int() 转不了它" in message, message


def test_the_wrapping_case_of_learner_test_61():
    assert counted_in(torch.uint8)(12, 2, 9) == 10  # the right answer is 12
    assert (12, 2, 9) in receptive_field._CASES


def test_overflow_that_happened_to_give_right_answers_is_named(capsys):
    message = rejection(check_receptive_field, counted_in(torch.int16, "!= 0"))
    assert "答案都对" in message and "溢出" in message and "torch.int16" in message, message
    assert "✓" not in capsys.readouterr().out


def test_narrow_counts_thresholded_every_layer_pass(capsys):
    def every_layer(L, n_w, layers):
        band = tc.causal_mask(L, window=n_w + 1).to(torch.uint8)
        reach = band
        for _ in range(layers - 1):
            reach = ((reach @ band) > 0).to(torch.uint8)  # entries at most L
        return int(reach[-1].sum())

    assert_passes(check_receptive_field, every_layer, capsys)


def test_a_skeleton_with_a_message_is_still_a_skeleton(capsys):
    def skeleton(L, n_w, layers):
        raise NotImplementedError("写好再运行")

    assert_skeleton(check_receptive_field, skeleton, capsys)
