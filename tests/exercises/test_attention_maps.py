"""check_weight_on_next (exercise 4.3): the weight each head puts on the next key, graded
on a masked and an unmasked model (untrained stand-ins here: the checker reads the
weights of whichever models it is given)."""

import pytest
import torch

from transformer_course import notebook as nb
from transformer_course.exercises import check_weight_on_next
from transformer_course.toy_tasks import TinyTransformer

from .support import assert_passes


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    models = {
        name: TinyTransformer(16, 16, 12, causal=causal).eval()
        for name, causal in (("masked", True), ("unmasked", False))
    }
    return dict(**models, x=torch.randint(16, (40, 11), generator=torch.Generator().manual_seed(1)))


def attention(model, x):
    with torch.no_grad(), nb.record_attention(model) as maps:
        model(x)
    return maps[model.layers[0].self_attn]  # (N, H, L, L)


def diagonal(model, x, offset):
    return attention(model, x).diagonal(offset=offset, dim1=-2, dim2=-1)


def weights(model, x):
    return diagonal(model, x, 1)  # (N, H, L-1)


def loop(model, x):  # right (learner test 58)
    w = attention(model, x)
    return torch.stack([w[:, :, i, i + 1] for i in range(w.size(-1) - 1)], -1).mean(dim=(0, 2))


def heads_last(model, x):  # right, float64 (learner test 58)
    w = attention(model, x).permute(0, 2, 3, 1).double()  # (N, L, L, H)
    return torch.stack([w[:, i, i + 1] for i in range(w.size(1) - 1)], 1).flatten(0, 1).mean(0)


@pytest.mark.parametrize("right", [lambda m, x: weights(m, x).mean(dim=(0, 2)), loop, heads_last])
def test_right_answers_pass(pair, right, capsys):
    assert_passes(check_weight_on_next, right, capsys, **pair)


def test_skeleton(pair, capsys):
    def skeleton(model, x):
        pass

    assert check_weight_on_next(skeleton, **pair) is None
    assert capsys.readouterr().out.startswith("尚未实现：skeleton 返回了 None")
    with pytest.raises(AssertionError, match="骨架"):
        check_weight_on_next(skeleton, **pair, solution=True)


@pytest.mark.parametrize(
    ("answer", "keyword"),
    [
        # learner test 22b: divided by L; averaged over the heads too
        (lambda m, x: weights(m, x).sum(-1).mean(0) / x.size(1), "除以了 L"),
        (lambda m, x: weights(m, x).mean().expand(weights(m, x).size(1)), "你对头也求了平均"),
        (lambda m, x: weights(m, x).sum(-1).mean(0), "对查询位置 i 求了和"),
        # learner test 25b: these three got the generic recipe
        (lambda m, x: diagonal(m, x, 0).mean(dim=(0, 2)), "放给自己（键 i）"),
        (lambda m, x: attention(m, x).triu(1).sum(-1)[..., :-1].mean(dim=(0, 2)), "所有后面的键"),
        (lambda m, x: diagonal(m, x, 1)[0].mean(-1), "只用了第一个样本"),
        (lambda m, x: diagonal(m, x, -1).mean(dim=(0, 2)), "键 i−1（前一个位置）"),
        # learner test 65: the map transposed, then offset 1, was told "offset 应为 +1"
        (lambda m, x: attention(m, x).mT.diagonal(1, -2, -1).mean(dim=(0, 2)), "权重矩阵被转置了"),
        # learner test 36b: only query 0 averaged
        (lambda m, x: diagonal(m, x, 1)[..., 0].mean(0), "只用了查询 0"),
        # learner test 24b: a list or an ndarray was a raw TypeError from torch.stack
        (lambda m, x: weights(m, x).mean(dim=(0, 2)).tolist(), "应返回 torch.Tensor，收到 list"),
        (lambda m, x: weights(m, x).mean(dim=(0, 2)).numpy(), "应返回 torch.Tensor，收到 ndarray"),
        (lambda m, x: weights(m, x).mean(0), "应返回形状 (2,) 的张量"),
        # learner test 58: four numbers shown for an (H,) answer, without saying why
        (lambda m, x: weights(m, x).median(-1).values.mean(0), "前 2 个数是有掩码的模型，后 2 个是无掩码的"),
        # learner test: reductions in place of the one diagonal, each got the generic hint
        (lambda m, x: attention(m, x).mean(0).mean(-1).mean(-1), "这是整个权重矩阵的平均"),
        (lambda m, x: attention(m, x).sum(-1).mean(dim=(0, 2)), "查询 i 在全部键上的权重加了起来"),
        (lambda m, x: diagonal(m, x, 2).mean(dim=(0, 2)), "键 i + 2"),
        (lambda m, x: weights(m, x)[..., 1:].mean(dim=(0, 2)), "少了查询 0"),
        (lambda m, x: weights(m, x).amax(dim=(0, 2)), "取的是最大值"),
        (lambda m, x: weights(m, x).mean(-1).sum(0), "对样本求了和"),
        (lambda m, x: weights(m, x).sum(dim=(0, 2)), "对样本和查询位置求的都是和"),
    ],
)
def test_each_mistake_gets_its_hint(pair, answer, keyword):
    with pytest.raises(AssertionError) as info:
        check_weight_on_next(answer, **pair)
    assert keyword in str(info.value), info.value


def test_the_stand_in_models_differ_as_trained_ones_do(pair):
    """the masked model's weight on the next key is exactly 0, the other's is not"""
    assert torch.equal(weights(pair["masked"], pair["x"]), torch.zeros_like(weights(pair["masked"], pair["x"])))
    assert weights(pair["unmasked"], pair["x"]).abs().max() > 0


def test_bad_arguments_are_named(pair):
    right = loop
    with pytest.raises(TypeError, match="unmasked must be a model"):
        check_weight_on_next(right, masked=pair["masked"], unmasked=None, x=pair["x"])
    with pytest.raises(TypeError, match="x must be a LongTensor"):
        check_weight_on_next(right, masked=pair["masked"], unmasked=pair["unmasked"], x=pair["x"].float())
    with pytest.raises(ValueError, match="at least 2 positions"):
        check_weight_on_next(right, masked=pair["masked"], unmasked=pair["unmasked"], x=pair["x"][:, :1])
    with pytest.raises(TypeError, match="keyword arguments"):
        check_weight_on_next(right, masked=pair["masked"], x=pair["x"])


def test_code_that_measures_other_data_is_told_so(pair, capsys):  # learner test 62
    def other_data(model, x):
        return weights(model, x[:-1]).mean(dim=(0, 2))  # one sample left out

    with pytest.raises(AssertionError) as info:
        check_weight_on_next(other_data, **pair)
    assert "很接近" in str(info.value) and "不要自己另造一批序列" in str(info.value), info.value
