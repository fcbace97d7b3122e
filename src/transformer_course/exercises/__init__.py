"""Checkers for the book's build exercises: they grade the learner's own code, offline,
with hints in Chinese. ``tc.exercises.check_*`` are the public names.

The build-exercise pattern of every chapter:

1. a **skeleton** cell under the learner's name (``my_self_attention``,
   ``MyMultiHeadAttention``) whose body is ``pass`` (or raises ``NotImplementedError``);
2. a **checker** cell right after it:
   ``tc.exercises.check_self_attention(my_self_attention)``;
3. the **solution** in a closed dropdown under *another* name (``solution_...``,
   ``Solution...``), graded by the same checker with ``solution=True``. "Run All" never
   overwrites the learner's code, and CI grades the solution.

A checker ``check_xxx(candidate, *, solution=False)`` compares the candidate with the
package's own implementation (or with the package's module holding the candidate's
weights) on several random inputs from a local generator; the notebook's global RNG
state is restored afterwards. Right: one line starting with ``✓``. Wrong:
:class:`ExerciseError` (an ``AssertionError``) with a Chinese message naming the likely
mistake. Still a skeleton: ``尚未实现：…`` without raising (with ``solution=True`` it
raises).

**Progress.** A checker call may name its exercise: ``check_gpt(MyGPT,
exercise="5.7")`` (the number the book prints in the exercise's title; two checkers in
one exercise share it). :func:`progress` (the last cell of a chapter) then prints
which of these passed, are skeletons, or failed in this kernel.

**What is accepted works later.** A checker tests what the page's later cells rely on:
the names, biases, eps and tied head of the printed ``tc`` code, no dropout, the return
types. Weights move between a learner's model and ``tc.MiniGPT`` with
:func:`copy_parameters` (by parameter name, buffers left alone), the same function the
checkers grade with.

**One vocabulary.** An exercise requires the attribute and argument names of the
package code that the book prints: ``q_proj``/``k_proj``/``v_proj``/``out_proj``
(:class:`~transformer_course.MultiHeadAttention`), ``norm1``/``norm2``/``self_attn``/
``ffn`` (:class:`~transformer_course.TransformerBlock`), ``w1``/``w2``/``w3``
(:class:`~transformer_course.FeedForward`), ``weight``/``bias`` (LayerNorm),
``tok_emb``/``pos_emb``/``blocks``/``norm_f``/``lm_head``
(:class:`~transformer_course.MiniGPT`), ``attn_mask`` and ``input_ids``. A checker
copies the learner's weights into the package module by these names.

**Adding a checker for a new exercise.**

* One module per topic (``attention``, ``heads``, ``norms_ffn``, ``positions``,
  ``blocks_gpt``, ``training``, ``generation_cache``, ``tokenizer``, ``efficient``,
  ``encoder``, ``objective``, ``linear_attention``, ``seq2seq``, ``cached_generation``,
  ``self_check``, ``language_model``, ``translation_model``, ``numeric_answers``,
  ``attention_maps``, ``online_softmax``, ``receptive_field``, ``ffn_memory``);
  a new topic gets a new module.
  Re-export the checker here and list it in ``__all__``.
* Write the checker body as ``@checker("中文标题", wants_class=...)`` over
  ``body(candidate) -> detail``: the wrapper (in ``_protocol``) handles skeletons,
  RNG isolation, the ``✓`` line and hides the checker's frames from the traceback, so a
  body never sets ``__tracebackhide__``. Call the learner's code only through
  ``run_learner`` / ``construct`` / ``run_module``: a crash then names the learner's
  line. An exercise that rebuilds a package function by hand runs the learner's code
  under ``calls_refused((that function, ...), message)``: calling the answer fails,
  however the learner reached it. One that forbids a way of computing (the full
  (L, S) score matrix of a blockwise exercise) runs it under ``CallWatch(test)``,
  which records whether ``test(func, args, out)`` held for any of its torch calls.
* An exercise whose answer is values rather than code (two matrices) names them:
  ``@checker("中文标题", values=("W_q", "W_k"))`` gives ``check(W_q, W_k, *, ...)``;
  its body raises ``Skeleton`` for a value still ``None``.
* Messages use the shape letters of the exercise's page: a body that takes
  ``exercise`` fills its templates' ``{L}``, ``{S}``, ``{D}``, ``{H}`` from
  ``shape_letters(exercise)`` (``_report``): chapter 2 keeps the paper's n, m, d_k, h.
* Keep the topic's typical mistakes as data: a hint table ``[(hint, mistake), ...]``
  at module level, a ``_xxx_variant(..., mistake)`` function computing what each
  mistake outputs, and ``first_reproduced(out, table, variant)`` (``_report``) to pick
  the hint. Messages use the helpers of ``_report`` (``check_shape``,
  ``where_differs``, ...).
* Crashes in the learner's code: a topic's ``<TOPIC>_CRASHES = [(pattern, hint), ...]``
  (pattern searched in "ExceptionType: message\\nthe learner's line") passed as
  ``causes=`` to ``run_learner``, tried before the general ``_protocol.CRASH_CAUSES``
  (searched in "ExceptionType: message" only); the message always quotes the
  learner's exception and line, the hint only where a pattern matches.
* Tests go to ``tests/exercises/test_<topic>.py``: hand-written correct variants and
  mutants (never the checker's own variant function), and every entry of the topic's
  ``*_HINTS`` / ``*_CRASHES`` tables reached by at least one mutant.
"""

from ._progress import progress
from ._protocol import ExerciseError
from .ablations import check_paired_ablation
from .attention import check_causal_mask, check_self_attention
from .attention_maps import check_weight_on_next
from .blocks_gpt import check_gpt, check_transformer_block, copy_parameters
from .cached_generation import check_cached_forward
from .derivation_checks import check_padding_mask
from .dropout_placement import check_encoder_dropout
from .efficient import (
    check_grouped_attention,
    check_kv_cache_bytes,
    check_prefix_lm_mask,
    check_sparsemax,
    check_streaming_attention,
)
from .encoder import check_encoder_layer
from .ffn_memory import check_add_memory
from .generation_cache import check_generate, check_kv_cache
from .heads import check_head_contributions, check_multi_head_attention
from .language_model import (
    check_dropout_row_sum_variance,
    check_lm_training,
    check_split_heads,
)
from .linear_attention import check_rnn_linear_attention
from .minigpt_extras import check_kv_cache_in_model, check_post_ln_block
from .norms_ffn import check_feed_forward, check_layer_norm, check_swiglu
from .numeric_answers import check_answer, check_number
from .objective import check_smoothed_loss
from .online_softmax import check_online_softmax
from .positions import (
    check_distance_only_projection,
    check_rope,
    check_sinusoidal_encoding,
)
from .predictions import compare_prediction
from .receptive_field import check_receptive_field
from .roadmap_checks import check_leak_fixed, check_witten_bell
from .sampling_filters import check_top_p_filter
from .self_check import (
    check_causality_probe,
    check_greedy_with_cache,
    check_qkv_answers,
    check_softmax_jacobian,
)
from .seq2seq import (
    check_cross_attention_alignment,
    check_decoder_layer,
    check_greedy_decode,
    check_rectangular_causal_mask,
    check_seq2seq_loss,
)
from .tokenizer import check_bpe_merge, check_merge_pair, check_pair_counts
from .training import check_lm_batch, check_train_step
from .translation_bugs import check_decoder_batch, check_order_blind_translator
from .translation_model import check_transformer

__all__ = [
    "ExerciseError",
    "check_self_attention",
    "check_causal_mask",
    "check_padding_mask",
    "check_decoder_batch",
    "check_order_blind_translator",
    "check_multi_head_attention",
    "check_head_contributions",
    "check_layer_norm",
    "check_sinusoidal_encoding",
    "check_rope",
    "check_distance_only_projection",
    "check_feed_forward",
    "check_swiglu",
    "check_transformer_block",
    "check_gpt",
    "check_train_step",
    "check_lm_batch",
    "check_generate",
    "check_top_p_filter",
    "check_kv_cache",
    "check_pair_counts",
    "check_merge_pair",
    "check_bpe_merge",
    "compare_prediction",
    "copy_parameters",
    "progress",
    "check_encoder_layer",
    "check_encoder_dropout",
    "check_smoothed_loss",
    "check_rnn_linear_attention",
    "check_cached_forward",
    "check_qkv_answers",
    "check_softmax_jacobian",
    "check_causality_probe",
    "check_kv_cache_bytes",
    "check_greedy_with_cache",
    "check_decoder_layer",
    "check_seq2seq_loss",
    "check_greedy_decode",
    "check_rectangular_causal_mask",
    "check_cross_attention_alignment",
    "check_grouped_attention",
    "check_sparsemax",
    "check_prefix_lm_mask",
    "check_streaming_attention",
    "check_split_heads",
    "check_dropout_row_sum_variance",
    "check_lm_training",
    "check_witten_bell",
    "check_leak_fixed",
    "check_post_ln_block",
    "check_kv_cache_in_model",
    "check_paired_ablation",
    "check_transformer",
    "check_number",
    "check_answer",
    "check_weight_on_next",
    "check_online_softmax",
    "check_receptive_field",
    "check_add_memory",
]
