"""Chapter 4's page-local graders (the check functions of 4.3, 4.4, 4.16 and 4.20),
read from the page and run here on hand-written answers: each typical wrong answer the
learner tests found gets the hint that names it; the cells of the numeric answers and
of prediction 4.2 are checked to reach ``tc.exercises.check_number`` (whose hints
``test_numeric_answers`` tests). Untrained models stand in for 4.3's trained pair (the grader
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
    "progression": "def progression_batch",
    "memory": "n_mem, E_m, tau = 20, 64, 0.7",
    "4.2": "my_prediction_distance = None",
    "4.2 check": "uniform_32 = torch.full((32, 32)",
    "4.3 skeleton": "def my_weight_on_next",
    "4.3": "def check_weight_on_next",
    "4.1": 'check_number("attention_bytes", my_bytes_answer',
    "4.11": 'check_number("qk_norm_temperature", my_g_min',
    "4.12": 'check_number("sparsemax_slopes", my_slopes',
    "4.16 skeleton": "def my_receptive_field",
    "4.16": "def check_receptive_field",
    "4.14": 'check_number("retrieved_lags", my_k_h2',
    "4.18": 'check_number("weight_decay_factor", my_decay',
    "4.17": 'check_number("rope_base_period", my_base',
    "4.20 skeleton": "def my_add_memory",
    "4.20": "def check_add_memory",
    "4.4 bug": "def buggy_online_softmax",
    "4.4": "def check_online_softmax",
}


@pytest.fixture(scope="module")
def cells():
    return page_cells("ch04_design_deep_dive.md", MARKERS)


def run(ns, source, name):
    return run_cell(ns, source, f"ch04: {name}")


@pytest.fixture(scope="module")
def page(cells):
    ns: dict = {}
    for key in ("imports", "seeds", "progression", "memory"):
        run(ns, cells[key], key)
    ns["TinyTransformer"] = tc.toy_tasks.TinyTransformer
    ns["causal_runs"] = {
        name: (ns["TinyTransformer"](16, 16, 12, causal=causal).eval(), None, None)
        for name, causal in (("有掩码", True), ("无掩码", False))
    }  # untrained stand-ins for the two trained models
    for key in ("4.3 skeleton", "4.3", "4.20 skeleton", "4.20", "4.4 bug", "4.4"):
        run(ns, cells[key], key)
    return ns


def rejected(fn, *args):
    with pytest.raises(AssertionError) as info:
        fn(*args)
    return str(info.value)


# ---- the numeric answers and prediction 4.2: the page's cells reach check_number ----


def test_4_2_cell_shows_the_prediction_next_to_the_measurement(page, cells):
    source = cells["4.2"].replace("my_prediction_distance = None", "my_prediction_distance = 32 / 3")
    out = run(page, source + "\n" + cells["4.2 check"], "4.2")
    assert "这是大 L 的近似 L/3" in out and "实际 10.656。" in out, out


# (cell, the learner's variable, a right answer, a wrong answer and a keyword of its hint)
NUMERIC_CELLS = [
    ("4.1", "my_bytes_answer", (2, 8), (8, 2), "顺序反了"),
    ("4.11", "my_g_min", 0.5 * math.log(891), 3.40, "只是有效数字不够"),
    ("4.12", "my_slopes", (0.5, 0.25), (0.25, 0.5), "顺序反了"),
    ("4.14", "my_k_h2", (4 * 0.84 - 0.5) * 8 / 7, 3.36, "漏了瞎猜的部分"),
    ("4.17", "my_base", (7 / (2 * math.pi)) ** 8, 7.0**8, "漏了 2π"),
    ("4.18", "my_decay", 0.999**200, 0.8187, "连续时间的近似"),
]


@pytest.mark.parametrize(("key", "name", "right", "wrong", "keyword"), NUMERIC_CELLS)
def test_numeric_cells_grade_the_learners_variable(page, cells, key, name, right, wrong, keyword):
    page["acc_h"] = {(2, 2): 0.84, (1, 1): 0.6}  # stand-ins for the trained accuracies
    try:
        for answer in (None, right):
            page[name] = answer
            out = run(page, cells[key], key)
            assert out.startswith(("尚未作答：" if answer is None else "✓ ") + f"练习 {key}："), out
        page[name] = wrong
        assert keyword in rejected(run, page, cells[key], key)
    finally:
        page[name] = None


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


# ---- 4.20: one more memory ----------------------------------------------------------------


def add_memory(bias=False, scale=1.0):
    def fn(ffn, k_new, v_new, tau):
        E, d_ff = ffn.w1.in_features, ffn.w1.out_features
        bigger = tc.FeedForward(E, d_ff + 1, "relu", bias=bias)
        with torch.no_grad():
            bigger.w1.weight.copy_(torch.cat([ffn.w1.weight, torch.cat([k_new, -tau * torch.ones(1, 1)], 1)]))
            bigger.w2.weight.copy_(torch.cat([ffn.w2.weight, v_new.T / (1 - tau) * scale], 1))
        return bigger

    return fn


def test_4_20_hints(page):
    page["check_add_memory"](add_memory())
    # learner test 22b: bias=True, its random biases left in
    assert "新的 FFN 带了偏置" in rejected(page["check_add_memory"], add_memory(bias=True))
    assert "W₂ 的新列要除以 1 − τ" in rejected(page["check_add_memory"], add_memory(scale=1 - page["tau"]))
    assert "新的一条不对" in rejected(page["check_add_memory"], add_memory(scale=2.0))


def test_4_20_names_the_activation_and_a_replaced_memory(page):
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


def test_4_20_grades_with_another_ffn_and_tau(page):
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
    assert "函数没有用参数 tau" in rejected(page["check_add_memory"], tau_fixed)


@pytest.mark.parametrize("fixed", [0.5, 0.6])
def test_4_20_a_hard_coded_tau_is_caught_and_not_named_as_another_value(page, fixed):
    """learner test 58: τ = 0.5 hard-coded passed (the second τ was 0.5), and 0.6 was told
    "τ 写成了 0.7" """
    right = add_memory()

    def tau_fixed(ffn, k_new, v_new, tau):
        return right(ffn, k_new, v_new, fixed)

    message = rejected(page["check_add_memory"], tau_fixed)
    assert "函数没有用参数 tau" in message and "0.7" not in message, message


def test_4_20_a_learner_who_changes_ffn_in_place_is_told_and_the_page_keeps_its_ffn(page):
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


# ---- 4.4: the online softmax ------------------------------------------------------------------


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
def test_4_4_hints(page, mistake, keyword):
    page["check_online_softmax"](online_softmax(None))
    assert keyword in rejected(page["check_online_softmax"], online_softmax(mistake))
    assert "那一行还没改" in rejected(page["check_online_softmax"], page["buggy_online_softmax"])


def test_4_3_says_which_numbers_are_which_model(page):
    """learner test 58: four numbers shown for an (H,) answer, without saying why"""
    message = rejected(page["check_weight_on_next"], lambda m, x: weights(m, x).median(-1).values.mean(0))
    assert "前 2 个数是有掩码的模型，后 2 个是无掩码的" in message, message


def test_4_4_accepts_float64_and_names_the_missing_division(page):
    """learner test 58: a float64 answer crashed with a raw RuntimeError, and `return o`
    was sent to the fix factor"""
    right = online_softmax(None)
    page["check_online_softmax"](lambda q, k, v, block=4: right(q.double(), k.double(), v.double(), block))

    def no_division(q, k, v, block=4):
        return right(q, k, v, block) * _ell(q, k, block)

    message = rejected(page["check_online_softmax"], no_division)
    assert "最后要除以 ℓ" in message and "fix" not in message, message


def _ell(q, k, block):
    """The online softmax's final ℓ (= Σ exp(s − max s)); o = output · ℓ."""
    s = q @ k.mT / math.sqrt(q.size(-1))
    return torch.exp(s - s.amax(-1, keepdim=True)).sum(-1, keepdim=True)


def test_the_stand_in_models_differ_as_the_trained_ones_do(page):
    """4.3's grader sees a masked and an unmasked model: the masked one's weight on the
    next key is exactly 0, the other's is not."""
    x = page["x_next"]
    masked, unmasked = (page["causal_runs"][n][0] for n in ("有掩码", "无掩码"))
    assert torch.equal(weights(masked, x), torch.zeros_like(weights(masked, x)))
    assert weights(unmasked, x).abs().max() > 0


# ---- 4.16: learner test 25b found one generic line ------------------------------------


def test_4_16_names_the_sum_over_all_rows(page, cells):
    for key in ("4.16 skeleton", "4.16"):
        run(page, cells[key], key)

    def all_rows(L, n_w, layers):
        band = tc.causal_mask(L, window=n_w + 1).float()
        reach = torch.eye(L)
        for _ in range(layers):
            reach = ((band @ reach) > 0).float()
        return int(reach.sum())

    assert "所有位置的感受野之和" in rejected(page["check_receptive_field"], all_rows)


@pytest.mark.parametrize("start", ["ones", "eye"])
def test_4_16_names_the_elementwise_product(page, cells, start):
    """learner test 30b: `band * reach` in a loop got "只算了一层" without the `*`"""
    for key in ("4.16 skeleton", "4.16"):
        run(page, cells[key], key)

    def elementwise(L, n_w, layers):
        band = tc.causal_mask(L, window=n_w + 1).float()
        reach = torch.ones(L, L) if start == "ones" else torch.eye(L)
        for _ in range(layers):
            reach = ((band * reach) > 0).float()
        return int(reach[-1].sum())

    assert "逐元素的" in rejected(page["check_receptive_field"], elementwise)


def test_4_16_requires_the_mask_product_and_names_one_layer_too_few(page, cells):
    """learner test 58: the closed formula the text forbids passed; one layer too few got
    the generic hint"""
    for key in ("4.16 skeleton", "4.16"):
        run(page, cells[key], key)

    def formula(L, n_w, layers):
        return min(layers * n_w + 1, L)

    def one_too_few(L, n_w, layers):
        band = tc.causal_mask(L, window=n_w + 1).float()
        reach = torch.eye(L)
        for _ in range(layers - 1):
            reach = ((band @ reach) > 0).float()
        return int(reach[-1].sum())

    def vector(L, n_w, layers):  # right: one row pushed through the mask (learner test 58)
        band = tc.causal_mask(L, window=n_w + 1)
        reach = torch.zeros(L, dtype=torch.bool)
        reach[-1] = True
        for _ in range(layers):
            reach = (reach.float() @ band.float()) > 0
        return int(reach.sum())

    def power(L, n_w, layers):  # right
        band = tc.causal_mask(L, window=n_w + 1).long()
        return torch.linalg.matrix_power(band, layers)[-1].count_nonzero().item()

    def einsum(L, n_w, layers):  # right
        band, reach = tc.causal_mask(L, window=n_w + 1).double(), torch.eye(L, dtype=torch.float64)
        for _ in range(layers):
            reach = torch.einsum("ij,jk->ik", reach, band).sign()
        return int(reach[-1].sum())

    message = rejected(page["check_receptive_field"], formula)
    assert "没有做掩码矩阵的乘积" in message, message
    assert "少算了一层" in rejected(page["check_receptive_field"], one_too_few)
    for right in (vector, power, einsum):
        page["check_receptive_field"](right)
