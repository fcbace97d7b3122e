"""Chapter 4's page-local graders (the ``self_check`` cells and the check functions of
4.3, 4.19 and 4.21) and its graded prediction 4.2, read from the page and run here
on hand-written answers: each typical wrong answer the learner tests found gets the
hint that names it. Untrained models stand in for 4.3's trained pair (the grader
compares with weights read from whichever model it is given)."""

import copy
import math

import pytest
import torch

import transformer_course as tc

from .support import page_cells, run_cell

# one marker per code cell the graders need (definitions and cheap set-up only)
MARKERS = {
    "imports": "import transformer_course as tc",
    "seeds": "def seeds(k, n=5)",
    "self_check": "def self_check(answer, expected",
    "progression": "def progression_batch",
    "memory": "n_mem, E_m, tau = 20, 64, 0.7",
    "4.2": "my_prediction_distance = None",
    "4.2 check": "uniform_32 = torch.full((32, 32)",
    "4.3 skeleton": "def my_weight_on_next",
    "4.3": "def check_weight_on_next",
    "4.1": "my_bytes_answer, (2, 8)",
    "4.10": "my_g_min, 0.5 * math.log(9 * 99)",
    "4.11": "def slope_at_zero",
    "4.15 skeleton": "def my_receptive_field",
    "4.15": "def check_receptive_field",
    "4.13": "acc_2 = acc_h[(2, 2)]",
    "4.17": "DECAY_EXACT, DECAY_LINEAR =",
    "4.16": "my_base, (7 / (2 * math.pi)) ** 8",
    "4.19 skeleton": "def my_add_memory",
    "4.19": "def check_add_memory",
    "4.21 bug": "def buggy_online_softmax",
    "4.21": "def check_online_softmax",
}


@pytest.fixture(scope="module")
def cells():
    return page_cells("ch04_design_deep_dive.md", MARKERS)


def run(ns, source, name):
    return run_cell(ns, source, f"ch04: {name}")


@pytest.fixture(scope="module")
def page(cells):
    ns: dict = {}
    for key in ("imports", "seeds", "self_check", "progression", "memory"):
        run(ns, cells[key], key)
    ns["TinyTransformer"] = tc.toy_tasks.TinyTransformer
    ns["causal_runs"] = {
        name: (ns["TinyTransformer"](16, 16, 12, causal=causal).eval(), None, None)
        for name, causal in (("有掩码", True), ("无掩码", False))
    }  # untrained stand-ins for the two trained models
    for key in ("4.3 skeleton", "4.3", "4.19 skeleton", "4.19", "4.21 bug", "4.21"):
        run(ns, cells[key], key)
    return ns


def rejected(fn, *args):
    with pytest.raises(AssertionError) as info:
        fn(*args)
    return str(info.value)


# ---- 4.2: a graded prediction ------------------------------------------------------


@pytest.mark.parametrize(
    ("prediction", "verdict"),
    [
        ("(32**2 - 1) / (3 * 32)", "✓"),
        ("10.66", "✓"),
        ("32 / 3", "这是大 L 的近似 L/3"),  # learner tests 22b and 23
        ("10.667", "这是大 L 的近似 L/3"),
        ("(32 + 1) / 3", "只对 j ≠ i 的 L(L − 1) 对求了平均"),
        ("10.4", "对照解答里的推理"),
        ("7.75", "这是因果均匀"),  # learner test 24b: three answers got the generic line
        ("16", "L/2 大约是一端的查询"),
        ("10.7", "只是位数不够"),
        # learner test 25b: four answers got the generic line
        ("10.65", "很接近"),  # truncated, not rounded
        ("31 / 3", "(L − 1)/3 也是近似"),
        ("(31**2 - 1) / (3 * 31)", "代入的 L 错了"),
        ("16.5", "因果均匀的有效键数"),
        ("32", "双向均匀的有效键数"),
        ("15.5", "(L − 1)/2 是第 0 个查询"),
    ],
)
def test_4_2_names_the_large_L_limit_and_the_missing_diagonal(page, cells, prediction, verdict):
    source = cells["4.2"].replace("my_prediction_distance = None", f"my_prediction_distance = {prediction}")
    out = run(page, source + "\n" + cells["4.2 check"], "4.2")
    assert verdict in out, out
    assert "实际 10.656。" in out  # learner test 23: "实际 10.66" while 10.6667 was wrong


# ---- the self_check cells -----------------------------------------------------------


def self_check_message(page, cells, key, name, answer):
    page[name] = answer
    try:
        return rejected(run, page, cells[key], key)
    finally:
        page[name] = None


@pytest.mark.parametrize(
    ("answer", "keyword"),
    [
        (3.392, "很接近：与正确值相差不到 1%"),  # learner test 22b: an arithmetic slip
        (3.3955, "很接近"),  # a slip in the 4th digit
        (0.5 * math.log(99), "漏了因子 9"),
        (3.40, "只是有效数字不够"),
        (3.39, "很接近"),
        (0.5 * math.log(892), "多加了 1"),  # learner test 24b: accepted at 0.1%
        (3.397, "多加了 1"),
        (math.log(9 * 99), "大了一倍"),
        (0.5 * math.log(9 * 100), "不是 S 个"),
        (math.log(900), "两处"),  # learner test 36b: neither the 1/2 nor 9·99
        (0.5 * math.log(99 / 9), "不等式解反了"),
        (0.5 * math.log10(891), "以 10 为底"),  # learner test 25b
        (0.5 * math.log2(891), "以 2 为底"),
        (1.0, "令 e^{2g}/(e^{2g}+S−1) = 0.9，解出 g"),
    ],
)
def test_4_10_hints(page, cells, answer, keyword):
    assert keyword in self_check_message(page, cells, "4.10", "my_g_min", answer)


def test_4_10_accepts_the_right_answer(page, cells):
    page["my_g_min"] = 0.5 * math.log(891)
    try:
        run(page, cells["4.10"], "4.10")
    finally:
        page["my_g_min"] = None


@pytest.mark.parametrize("answer", [3.396, 0.5 * math.log(891)])
def test_4_10_accepts_four_digits(page, cells, answer):
    page["my_g_min"] = answer
    try:
        run(page, cells["4.10"], "4.10")
    finally:
        page["my_g_min"] = None


@pytest.mark.parametrize(
    ("answer", "keyword"),
    [
        ((8, 2), "顺序反了"),  # learner test 24b: same slip as 4.11
        ((4, 4), "只算了分数矩阵"),
        ((2, 1 / 8), "倍数倒过来了"),
        # learner test 25b: these three got the generic accounting line
        ((2, 16), "倍数却取了 L/D"),
        ((1, 16), "两边按一样多的矩阵算了"),
        ((4 / 3, 32 / 3), "不是同一笔账算出来的"),
        ((3, 4), "不是同一笔账算出来的"),
        ((3, 16 / 3), "两个 L×L 矩阵各 4L² 字节"),  # consistent but wrong: the general line
    ],
)
def test_4_1_hints(page, cells, answer, keyword):
    assert keyword in self_check_message(page, cells, "4.1", "my_bytes_answer", answer)


@pytest.mark.parametrize(
    ("answer", "keyword"),
    [
        (3.36, "漏了瞎猜的部分"),  # learner test 24b: was "只是有效数字不够"
        (3.15, "不是 1/4"),  # the 1/4-guess formula, rounded
        (3.0, "只是有效数字不够"),
        (2.0, "由 acc = (k + (4 − k)/8)/4 解出 k"),
        (2.5, "乘反了"),  # learner test 36b: (4·acc − 1/2)·7/8
        (0.84, "这是准确率本身"),  # learner test 25b
        (2.4, "这是 H = 1 的 4·acc"),
    ],
)
def test_4_13_names_the_listed_mistakes_before_the_digits(page, cells, answer, keyword):
    page["acc_h"] = {(2, 2): 0.84, (1, 1): 0.6}  # stand-ins for the trained accuracies
    assert keyword in self_check_message(page, cells, "4.13", "my_k_h2", answer)
    page["my_k_h2"] = (4 * 0.84 - 0.5) * 8 / 7
    run(page, cells["4.13"], "4.13")
    page["my_k_h2"] = None


@pytest.mark.parametrize(
    ("answer", "keyword"),
    [
        (0.8187, "连续时间的近似 exp(−200ηλ)"),  # learner test 24b: exp(-0.2) rounded
        (0.8186, "只是有效数字不够"),  # (1 - 0.001)**200 rounded to 4 digits
        (0.8188, "很接近：与正确值相差不到 1%"),  # was "不到 0.0%"
        (0.8178, "不是 201 次方"),
    ],
)
def test_4_17_hints(page, cells, answer, keyword):
    message = self_check_message(page, cells, "4.17", "my_decay", answer)
    assert keyword in message, message
    assert "0.0%" not in message


@pytest.mark.parametrize(
    ("answer", "keyword"),
    [
        ((7 / (2 * math.pi)) ** 4, "要么用了 D = 8"),  # learner test 22b: D = 8, not the third pair
        ((7 / (2 * math.pi)) ** 16, "指数用错了"),
        (7.0**8, "漏了 2π"),
        ((2 * math.pi / 7) ** 8, "解反了"),
        (5.0, "令它等于 7 解出 b"),
        (7 / (2 * math.pi), "还要把两边取 8 次方"),  # learner test 25b
        ((8 / (2 * math.pi)) ** 8, "相对距离最远是 7"),  # ch04 review 34: period 8 is off by one
        (6.907, "相对距离最远是 7"),
    ],
)
def test_4_16_hints(page, cells, answer, keyword):
    assert keyword in self_check_message(page, cells, "4.16", "my_base", answer)


# ---- 4.3: weight on the next position ---------------------------------------------------


def attention(model, x):
    with torch.no_grad(), tc.notebook.record_attention(model) as maps:
        model(x)
    return maps[model.layers[0].self_attn]  # (N, H, L, L)


def diagonal(model, x, offset):
    return attention(model, x).diagonal(offset=offset, dim1=-2, dim2=-1)


def weights(model, x):
    return diagonal(model, x, 1)  # (N, H, L-1)


@pytest.mark.parametrize(
    ("answer", "keyword"),
    [
        (lambda m, x: weights(m, x).mean(dim=(0, 2)), None),
        # learner test 22b: divided by L; averaged over the heads too
        (lambda m, x: weights(m, x).sum(-1).mean(0) / x.size(1), "除以了 L"),
        (lambda m, x: weights(m, x).mean().expand(weights(m, x).size(1)), "你对头也求了平均"),
        (lambda m, x: weights(m, x).sum(-1).mean(0), "对查询位置 i 求了和"),
        # learner test 25b: these three got the generic recipe
        (lambda m, x: diagonal(m, x, 0).mean(dim=(0, 2)), "放给自己（键 i）"),
        (lambda m, x: attention(m, x).triu(1).sum(-1)[..., :-1].mean(dim=(0, 2)), "所有后面的键"),
        (lambda m, x: diagonal(m, x, 1)[0].mean(-1), "只用了第一个样本"),
        # learner test 36b: only query 0 averaged
        (lambda m, x: diagonal(m, x, 1)[..., 0].mean(0), "只用了查询 0"),
        # learner test 24b: a list or an ndarray was a raw TypeError from torch.stack
        (lambda m, x: weights(m, x).mean(dim=(0, 2)).tolist(), "应返回 torch.Tensor，收到 list"),
        (lambda m, x: weights(m, x).mean(dim=(0, 2)).numpy(), "应返回 torch.Tensor，收到 ndarray"),
    ],
)
def test_4_3_hints(page, answer, keyword):
    if keyword is None:
        page["check_weight_on_next"](answer)
    else:
        assert keyword in rejected(page["check_weight_on_next"], answer)


# ---- 4.19: one more memory ----------------------------------------------------------------


def add_memory(bias=False, scale=1.0):
    def fn(ffn, k_new, v_new, tau):
        E, d_ff = ffn.w1.in_features, ffn.w1.out_features
        bigger = tc.FeedForward(E, d_ff + 1, "relu", bias=bias)
        with torch.no_grad():
            bigger.w1.weight.copy_(torch.cat([ffn.w1.weight, torch.cat([k_new, -tau * torch.ones(1, 1)], 1)]))
            bigger.w2.weight.copy_(torch.cat([ffn.w2.weight, v_new.T / (1 - tau) * scale], 1))
        return bigger

    return fn


def test_4_19_hints(page):
    page["check_add_memory"](add_memory())
    # learner test 22b: bias=True, its random biases left in
    assert "新的 FFN 带了偏置" in rejected(page["check_add_memory"], add_memory(bias=True))
    assert "W₂ 的新列要除以 1 − τ" in rejected(page["check_add_memory"], add_memory(scale=1 - page["tau"]))
    assert "新的一条不对" in rejected(page["check_add_memory"], add_memory(scale=2.0))


def test_4_19_names_the_activation_and_a_replaced_memory(page):
    """learner test 25b: a GELU activation got the hint about old memories"""
    right = add_memory()

    def gelu(ffn, k_new, v_new, tau):
        grown = right(ffn, k_new, v_new, tau)
        other = tc.FeedForward(grown.w1.in_features, grown.w1.out_features, "gelu", bias=False)
        other.load_state_dict(grown.state_dict())
        return other

    def replace_last(ffn, k_new, v_new, tau):
        new = copy.deepcopy(ffn)
        with torch.no_grad():
            new.w1.weight[-1] = torch.cat([k_new[0], -tau * torch.ones(1)])
            new.w2.weight[:, -1] = v_new[0] / (1 - tau)
        return new

    assert "激活函数是 gelu" in rejected(page["check_add_memory"], gelu)
    assert "要新加一个神经元" in rejected(page["check_add_memory"], replace_last)


def test_4_19_grades_with_another_ffn_and_tau(page):
    """learner test 30b: reading the page's memory_ffn, or a hard-coded τ = 0.7, passed
    when graded only with the page's own FFN and τ"""
    right = add_memory()

    def page_ffn(ffn, k_new, v_new, tau):
        return right(page["memory_ffn"], k_new, v_new, tau)

    def tau_fixed(ffn, k_new, v_new, tau):
        return right(ffn, k_new, v_new, 0.7)

    def scaled_row(ffn, k_new, v_new, tau):  # right: 1 / (1 − τ) moved into W₁'s new row
        grown = right(ffn, k_new, v_new, tau)
        with torch.no_grad():
            grown.w1.weight[-1] /= 1 - tau
            grown.w2.weight[:, -1] *= 1 - tau
        return grown

    page["check_add_memory"](scaled_row)
    assert "用的是全局的 memory_ffn" in rejected(page["check_add_memory"], page_ffn)
    assert "τ 写成了 0.7" in rejected(page["check_add_memory"], tau_fixed)


def test_4_19_a_learner_who_changes_ffn_in_place_is_told_and_the_page_keeps_its_ffn(page):
    """learner test 25b: zeroing w2 in place was accepted, and changing ffn in place broke
    the next (correct) attempt with a raw RuntimeError"""
    right = add_memory()

    def zero_w2_then_right(ffn, k_new, v_new, tau):
        with torch.no_grad():
            ffn.w2.weight.zero_()
        return right(ffn, k_new, v_new, tau)

    def grow_in_place(ffn, k_new, v_new, tau):
        grown = right(ffn, k_new, v_new, tau)
        ffn.w1, ffn.w2 = grown.w1, grown.w2
        return grown

    for changes_ffn in (zero_w2_then_right, grow_in_place):
        assert "不要改动传入的 ffn" in rejected(page["check_add_memory"], changes_ffn)
        page["check_add_memory"](right)  # the page's memory_ffn is unchanged


# ---- 4.21: the online softmax ------------------------------------------------------------------


def online_softmax(mistake):
    def fn(q, k, v, block=4):
        c = torch.full(q.shape[:-1] + (1,), -math.inf)
        ell = torch.zeros_like(c)
        o = torch.zeros(q.shape[:-1] + (v.size(-1),))
        for start in range(0, k.size(-2), block):
            s = q @ k[..., start : start + block, :].mT / (1 if mistake == "unscaled" else math.sqrt(q.size(-1)))
            c_new = torch.maximum(c, s.amax(-1, keepdim=True))
            fix = torch.exp(c_new - c) if mistake == "inverted" else torch.exp(c - c_new)
            p = torch.exp(s - (s.amax(-1, keepdim=True) if mistake == "block_max" else c_new))
            pv = p @ v[..., start : start + block, :]
            if mistake == "fix_after_add":  # learner test 24b
                ell = (ell + p.sum(-1, keepdim=True)) * fix
                o = (o + pv) * fix
            elif mistake == "ell_fixed_after_add":  # learner test 25b: inf, not nan
                ell = (ell + p.sum(-1, keepdim=True)) * fix
                o = o * fix + pv
            elif mistake == "ell_not_carried":  # learner test 36b: ℓ restarts every block
                ell = p.sum(-1, keepdim=True)
                o = o * fix + pv
            elif mistake == "neither_rescaled":  # learner test 25b
                ell = ell + p.sum(-1, keepdim=True)
                o = o + pv
            else:
                ell = ell * fix + p.sum(-1, keepdim=True)
                o = (o if mistake == "o_not_rescaled" else o * fix) + pv
            c = c if mistake == "c_not_updated" else c_new
        return o / ell

    return fn


@pytest.mark.parametrize(
    ("mistake", "keyword"),
    [
        ("inverted", "校正因子倒过来了"),  # learner test 23: was sent to the score scaling
        ("o_not_rescaled", "分子 o 里旧块的项没有按新的最大值缩小"),  # learner test 22b
        ("fix_after_add", "校正放在了加法之后"),
        ("ell_fixed_after_add", "校正放在了加法之后"),
        ("unscaled", "分数没有除以 √D"),  # learner test 25b: was "缩放与最后的 o / ℓ"
        ("neither_rescaled", "ℓ 和 o 都没有乘校正因子"),
        ("ell_not_carried", "ℓ 没有跨块累加"),  # learner test 36b: was sent to o
        ("c_not_updated", "c 没有更新"),  # learner test 30b: got the generic hint
        ("block_max", "减的是这一块自己的最大值"),  # learner test 30b
    ],
)
def test_4_21_hints(page, mistake, keyword):
    page["check_online_softmax"](online_softmax(None))
    assert keyword in rejected(page["check_online_softmax"], online_softmax(mistake))
    assert "那一行还没改" in rejected(page["check_online_softmax"], page["buggy_online_softmax"])


def test_the_stand_in_models_differ_as_the_trained_ones_do(page):
    """4.3's grader sees a masked and an unmasked model: the masked one's weight on the
    next key is exactly 0, the other's is not."""
    x = page["x_next"]
    masked, unmasked = (page["causal_runs"][n][0] for n in ("有掩码", "无掩码"))
    assert torch.equal(weights(masked, x), torch.zeros_like(weights(masked, x)))
    assert weights(unmasked, x).abs().max() > 0


# ---- 4.11 and 4.15: learner test 25b found one generic line in each ------------------------


@pytest.mark.parametrize(
    ("answer", "keyword"),
    [
        ((0.0, 0.25), "sparsemax 在 t = 0 附近不是平的"),
        ((0.5, 0.5), "σ(0) 本身，不是斜率"),
        ((0.25, 0.5), "顺序反了"),
    ],
)
def test_4_11_hints(page, cells, answer, keyword):
    assert keyword in self_check_message(page, cells, "4.11", "my_slopes", answer)


def test_4_15_names_the_sum_over_all_rows(page, cells):
    for key in ("4.15 skeleton", "4.15"):
        run(page, cells[key], key)

    def all_rows(L, n_w, layers):
        band = tc.causal_mask(L, window=n_w + 1).float()
        reach = torch.eye(L)
        for _ in range(layers):
            reach = ((band @ reach) > 0).float()
        return int(reach.sum())

    assert "所有位置的感受野之和" in rejected(page["check_receptive_field"], all_rows)


@pytest.mark.parametrize("start", ["ones", "eye"])
def test_4_15_names_the_elementwise_product(page, cells, start):
    """learner test 30b: `band * reach` in a loop got "只算了一层" without the `*`"""
    for key in ("4.15 skeleton", "4.15"):
        run(page, cells[key], key)

    def elementwise(L, n_w, layers):
        band = tc.causal_mask(L, window=n_w + 1).float()
        reach = torch.ones(L, L) if start == "ones" else torch.eye(L)
        for _ in range(layers):
            reach = ((band * reach) > 0).float()
        return int(reach[-1].sum())

    assert "逐元素的" in rejected(page["check_receptive_field"], elementwise)
