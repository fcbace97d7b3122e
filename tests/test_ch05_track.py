"""Chapter 5's build track with learner-style models: whatever ``check_gpt`` accepts must
work in every later cell of the page (weight copy, training, the step-by-step comparison
with ``tc.MiniGPT``, the attention view, generation, and the cached forward).

The page's own glue (``passes``, the solutions) is read from the chapter
and executed here, so the test follows the page; weights are copied as the page copies
them, with ``tc.exercises.copy_parameters``."""

import contextlib
import io
from pathlib import Path

import jupytext
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import transformer_course as tc

PAGE = Path(__file__).resolve().parents[1] / "book" / "ch05_hands_on_roadmap.md"
# one marker per code cell the glue needs (definitions only, no training)
MARKERS = [
    "import transformer_course as tc",
    "def solution_self_attention",
    "class SolutionMultiHeadAttention",
    "class SolutionFeedForward",
    "class SolutionGPT",
    "def solution_lm_batch",
    "def solution_train_step",
    "def passes",
    "def solution_generate",
    "class SolutionKVCache",
    "def solution_forward_with_cache",
]


@pytest.fixture(scope="module")
def page():
    cells = [c.source for c in jupytext.read(PAGE).cells if c.cell_type == "code"]
    ns: dict = {}
    for marker in MARKERS:
        found = [src for src in cells if marker in src]
        assert len(found) == 1, f"the page has {len(found)} cells with {marker!r}"
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(found[0], f"<ch05: {marker}>", "exec"), ns)  # noqa: S102
    return ns


# ---- learner-style variants of MyGPT, written as a learner would ------------------


class Attention(nn.Module):
    def __init__(self, d_model, num_heads, bias=True):
        super().__init__()
        self.num_heads = num_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            nn.Linear(d_model, d_model, bias=bias) for _ in range(4)
        )

    def forward(self, Q, K, V, attn_mask=None):
        N, L, E = Q.shape
        q, k, v = (
            p(t).view(N, -1, self.num_heads, E // self.num_heads).transpose(1, 2)
            for p, t in ((self.q_proj, Q), (self.k_proj, K), (self.v_proj, V))
        )
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.out_proj(o.transpose(1, 2).reshape(N, L, E))


class FFN(nn.Module):
    def __init__(self, d_model, d_ff, bias=True):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=bias)
        self.w2 = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    def __init__(self, d_model, num_heads, bias=True, mask_buffer=False):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model, bias=bias)
        self.self_attn = Attention(d_model, num_heads, bias)
        self.norm2 = nn.LayerNorm(d_model, bias=bias)
        self.ffn = FFN(d_model, 4 * d_model, bias)
        self.mask_buffer = mask_buffer
        if mask_buffer:  # nanoGPT / Karpathy's video: a persistent causal-mask buffer
            self.register_buffer("mask", torch.tril(torch.ones(256, 256, dtype=torch.bool)))

    def forward(self, x):
        L = x.shape[1]
        mask = self.mask[:L, :L] if self.mask_buffer else tc.causal_mask(L)
        h = self.norm1(x)
        x = x + self.self_attn(h, h, h, attn_mask=mask)
        return x + self.ffn(self.norm2(x))


def make_gpt(
    tie="tok_to_head", bias=True, mask_buffer=False, pos_buffer=False, returns_tuple=False, blocks_as="ModuleList"
):
    class LearnerGPT(nn.Module):
        def __init__(self, vocab_size, context_length, d_model, num_heads, num_layers):
            super().__init__()
            self.tok_emb = nn.Embedding(vocab_size, d_model)
            self.pos_emb = nn.Embedding(context_length, d_model)
            blocks = [Block(d_model, num_heads, bias, mask_buffer) for _ in range(num_layers)]
            self.blocks = nn.ModuleList(blocks) if blocks_as == "ModuleList" else (nn.Sequential(*blocks))
            self.norm_f = nn.LayerNorm(d_model, bias=bias)
            self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
            if tie == "tok_to_head":
                self.lm_head.weight = self.tok_emb.weight
            elif tie == "head_to_tok":
                self.tok_emb.weight = self.lm_head.weight
            if pos_buffer:
                self.register_buffer("pos", torch.arange(context_length))

        def forward(self, input_ids):
            L = input_ids.shape[1]
            pos = self.pos[:L] if pos_buffer else torch.arange(L)
            x = self.tok_emb(input_ids) + self.pos_emb(pos)
            for block in self.blocks:
                x = block(x)
            logits = self.lm_head(self.norm_f(x))
            return (logits, None) if returns_tuple else logits

    return LearnerGPT


VARIANTS = {
    "tied": make_gpt(),
    "tied the other way": make_gpt(tie="head_to_tok"),
    "untied head": make_gpt(tie=None),
    "causal-mask buffer": make_gpt(mask_buffer=True),
    "position buffer": make_gpt(pos_buffer=True),
    "bias-free layers": make_gpt(bias=False),
    "forward returns a tuple": make_gpt(returns_tuple=True),
    "blocks in nn.Sequential": make_gpt(blocks_as="Sequential"),
}


def passes(ns, check, candidate):
    return ns["passes"](check, candidate)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_what_check_gpt_accepts_runs_through_the_page(page, variant):
    ns, GPT = page, VARIANTS[variant]
    if not passes(ns, tc.exercises.check_gpt, GPT):
        return  # rejected: the page trains the solution instead, which the page tests
    V, T = 13, 16
    cfg = tc.GPTConfig(vocab_size=V, context_length=T, d_model=32, num_heads=4, num_layers=2)
    data = torch.randint(0, V, (400,), generator=torch.Generator().manual_seed(0))
    model = GPT(V, T, d_model=32, num_heads=4, num_layers=2)
    tc.set_seed(1)
    reference = tc.MiniGPT(cfg)
    tc.exercises.copy_parameters(reference, model)

    # the step-by-step comparison of the page (hidden check in 5.6)
    def steps(forward, module):
        opt = torch.optim.AdamW(
            [p for p in module.parameters() if p.requires_grad], lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0
        )
        gen = torch.Generator().manual_seed(2)
        return [ns["solution_train_step"](forward, opt, *ns["solution_lm_batch"](data, 8, T, gen)) for _ in range(5)]

    mine = steps(model, model)
    ref = steps(lambda z: reference(z)[0], reference)
    torch.testing.assert_close(torch.tensor(mine), torch.tensor(ref), atol=1e-4, rtol=0)

    # copying the trained weights back into MiniGPT (attention view)
    trained = tc.MiniGPT(cfg).eval()
    tc.exercises.copy_parameters(model, trained)
    model.eval()
    ids = data[None, :T]
    torch.testing.assert_close(trained(ids)[0], model(ids), atol=1e-4, rtol=1e-4)

    # generation and the cached forward with the learner's model and a cache class
    prompt = data[None, :4]
    plain = ns["solution_generate"](model, prompt, T - 4, T)
    caches = [ns["SolutionKVCache"]() for _ in model.blocks]
    fwd = ns["solution_forward_with_cache"]
    logits = fwd(model, prompt, caches, 4)
    out = prompt
    for _ in range(T - 4):
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        out = torch.cat([out, nxt], dim=1)
        logits = fwd(model, nxt, caches, 4)
    assert torch.equal(out, plain)


# the exercise text states each rule: a tied head, biases, forward returns the logits
REJECTED = {"untied head", "bias-free layers", "forward returns a tuple"}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_exercise_states_what_check_gpt_enforces(page, variant):
    """The buffers and nn.Sequential pass (so the test above exercises the
    page's glue with them); an untied head, bias-free layers and a tuple for logits are
    rejected, as the exercise says."""
    assert passes(page, tc.exercises.check_gpt, VARIANTS[variant]) == (variant not in REJECTED)
