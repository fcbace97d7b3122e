"""The checker protocol shared by every topic module: the ``@checker`` wrapper, skeleton
detection, RNG isolation, and calling the learner's code so that a crash names the
learner's own line."""

from __future__ import annotations

import functools
import inspect
import linecache
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

# Every check seeds its own generator from this; the learner's RNG state is untouched.
SEED = 20240527
RTOL, ATOL = 1e-4, 1e-5


class ExerciseError(AssertionError):
    """The candidate does not meet the exercise's contract; the message says in Chinese
    what is wrong and what the likely mistake is."""


class Skeleton(Exception):
    """Internal: the candidate is still a skeleton (None / NotImplementedError)."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(what)
        self.what, self.reason = what, reason


@contextmanager
def isolated_rng() -> Iterator[None]:
    """Run with the global CPU RNG seeded, and restore the learner's state afterwards
    (module constructors draw their initial weights from it)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        yield


def seeded_generator(offset: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(SEED + offset)


def randn(g: torch.Generator, *shape: int, scale: float = 1.0) -> Tensor:
    return torch.randn(*shape, generator=g) * scale


def random_mask(g: torch.Generator, *shape: int) -> Tensor:
    """A bool mask with at least one True and one False in every row."""
    mask = torch.rand(*shape, generator=g) < 0.6
    mask[..., 0] = True
    mask[..., -1] = False
    return mask


def name_of(candidate: object) -> str:
    if isinstance(candidate, functools.partial):  # partial(MyModel, option=...)
        return name_of(candidate.func)
    return getattr(candidate, "__name__", None) or type(candidate).__name__


# (exercise number, checker title) -> (status, candidate name), for progress()
RESULTS: dict[tuple[str, str], tuple[str, str]] = {}
PASSED, SKELETON, FAILED = "通过", "尚未实现", "未通过"


def _record(
    exercise: str | None, title: str, name: str, solution: bool, status: str
) -> None:
    """Keep a learner's (not a solution's) outcome under its exercise number."""
    if exercise is not None and not solution:
        RESULTS[str(exercise), title] = (status, name)


def checker(
    title: str,
    wants_class: bool = False,
    values: Sequence[str] = (),
    validate: Callable[..., None] | None = None,
) -> Callable:
    """Turn ``body(candidate) -> detail`` into a checker with the common protocol:
    ``check(candidate, *, solution=False, exercise=None)``. With ``exercise`` (the
    book's exercise number, e.g. ``"5.3"``) the outcome of a learner's call is kept for
    :func:`~transformer_course.exercises.progress`. A ``body`` that takes an
    ``exercise`` keyword also receives the number, for a rule only that exercise
    states. A checker of data rather than code names the values it grades in
    ``values`` (``("W_q", "W_k")``): it is called ``check(W_q, W_k, *, ...)`` and its
    body ``body(W_q, W_k)``; the body raises :class:`Skeleton` for a value still
    ``None``. What a check needs from the page (a trained model, a batch) is passed
    by the keywords the body declares keyword-only: ``body(fn, *, model)`` gives
    ``check(fn, model=..., ...)``; each is required, another keyword is a TypeError.
    ``validate(**keywords)`` raises TypeError / ValueError for values the check cannot
    use, before the learner's code runs."""

    def decorate(body: Callable[..., str]) -> Callable[..., None]:
        # a body with an ``exercise`` parameter grades the rules one exercise states
        params = inspect.signature(body).parameters
        by_exercise = "exercise" in params
        context = {n for n, p in params.items() if p.kind is p.KEYWORD_ONLY} - {
            "exercise"
        }
        arity = len(values) or 1

        @functools.wraps(body)
        def check(
            *candidates: object,
            solution: bool = False,
            exercise: str | None = None,
            **given: object,
        ) -> None:
            # the only frame the learner sees: IPython and pytest hide it, and every
            # ExerciseError is re-raised from here without the checker's inner frames
            __tracebackhide__ = True
            if len(candidates) != arity:
                raise TypeError(
                    f"{body.__name__} takes {arity} positional argument(s) "
                    f"({', '.join(values) or 'the candidate'}), got {len(candidates)}"
                )
            _refuse_keywords(body.__name__, given, context, validate)
            name = "、".join(values) or name_of(candidates[0])
            record = functools.partial(_record, exercise, title, name, solution)
            record(FAILED)  # until it gets further
            problem = None if values else _not_code(title, candidates[0], wants_class)
            if problem:
                raise ExerciseError(problem)
            try:
                with isolated_rng():
                    if by_exercise:
                        given["exercise"] = exercise
                    detail = body(*candidates, **given)
            except Skeleton as skel:
                if solution:
                    raise ExerciseError(
                        f"{title}：{skel.what} {skel.reason}——参考解答不能是骨架"
                        "（solution=True）。"
                    ) from None
                print(f"尚未实现：{skel.what} {skel.reason}（写好后重新运行本单元格）")
                record(SKELETON)
                return
            except ExerciseError as err:
                raise err.with_traceback(None) from None
            except Exception as err:  # an unexpected value made the checker trip
                raise ExerciseError(
                    f"{title}：检查 {name} 时出错（{type(err).__name__}: {err}）。"
                    "多半是返回值的类型或形状出乎意料：对照练习说明检查返回值。"
                ) from err
            print(f"✓ {title}：{name} 通过（{detail}）")
            record(PASSED)

        return check

    return decorate


def _refuse_keywords(
    name: str,
    given: Mapping[str, object],
    context: set,
    validate: Callable[..., None] | None,
) -> None:
    """TypeError unless the keywords ``given`` are exactly those a body declares; then
    the checker's own ``validate`` of their values."""
    if set(given) != context:
        raise TypeError(
            f"{name} takes the keyword arguments {sorted(context)}, got {sorted(given)}"
        )
    if validate is not None:
        validate(**given)


def _not_code(title: str, candidate: object, wants_class: bool) -> str | None:
    """What is wrong with a checker of code getting ``candidate`` (a function's result,
    an instance where the class is wanted), or None."""
    if not callable(candidate):
        return (
            f"{title}：要检查的应是一个函数或类，得到的是 "
            f"{type(candidate).__name__}（{candidate!r:.60}）。"
            "把函数/类本身传进来，不要先调用它。"
        )
    # a class with some constructor arguments bound (functools.partial) builds the
    # same modules: the checker only calls it with the remaining arguments
    partial = isinstance(candidate, functools.partial)
    bound = partial and isinstance(candidate.func, type)  # type: ignore[union-attr]
    if wants_class and not (isinstance(candidate, type) or bound):
        return (
            f"{title}：要检查的是类本身（如 MyMultiHeadAttention），得到的是"
            f"一个 {type(candidate).__name__} 实例：去掉类名后面的括号和参数，"
            "检查器会自己用不同的参数构造它。"
        )
    return None


def fail(message: str) -> None:
    raise ExerciseError(message)


def _user_frame(err: BaseException) -> tuple[str, str]:
    """``(位置, 源代码)`` of the innermost frame outside torch and this package."""
    package = os.path.dirname(os.path.dirname(__file__))  # transformer_course/
    skip = (os.path.dirname(torch.__file__), package)
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        if frame.filename.startswith(skip):
            continue
        line = (frame.line or linecache.getline(frame.filename, frame.lineno)).strip()
        return f"{os.path.basename(frame.filename)} 第 {frame.lineno} 行", line
    return "", ""


# What a crash most likely means: (regular expression, hint), searched in
# "ExceptionType: message" only, never in the learner's line (a line that merely
# mentions ``vocab_size`` says nothing about the error). A topic passes its own causes,
# tried first and searched in "ExceptionType: message\nthe learner's line" (a topic may
# know what a line such as ``K.T`` means).
CRASH_CAUSES = [
    (
        r"not implemented for 'Bool'",
        "torch 的矩阵乘法（@、matmul、mm）不支持布尔张量：先转成整数或浮点"
        "（如 .int()、.float()），乘完再用 > 0 变回布尔。",
    ),
    (
        r"view size is not compatible",
        "transpose（或 permute）之后张量在内存里不再连续（contiguous），"
        ".view 只能用于连续的张量：改用 .reshape(...)，"
        "或先 .contiguous() 再 .view(...)。",
    ),
    (
        r"'tuple' object has no attribute",
        "这里拿到的是一个元组：某个函数返回了 (输出, 权重) 之类的两个值，先解包，"
        "如 out, _ = my_self_attention(...)。",
    ),
    (
        r"modified by an inplace operation",
        "反向传播要用的张量在 backward 之前被原地改过了。最常见的原因是 "
        "optimizer.step() 放在了 loss.backward() 之前（step 原地更新了权重）："
        "每步的顺序是 zero_grad → 前向 → backward → step。若是前向里的 +=、"
        "masked_fill_ 之类的原地操作，改用不带下划线的版本（如 masked_fill）。",
    ),
    (
        r"cannot assign '[\w.]+' as child module",
        "这个属性已经注册为子模块，不能再赋成普通的 Python 对象：一组层要放在 "
        "nn.ModuleList([...]) 里，不能用 list（list 里的层不会注册，它们的参数"
        "对 parameters()、state_dict() 和 .to() 都不可见）。",
    ),
    (
        r"Expected target size|Expected input batch_size|spatial targets",
        "F.cross_entropy 要求类别在第 1 维：把 logits 展平成 (N*T, V)、目标展平成 "
        "(N*T,)，即 F.cross_entropy(logits.reshape(-1, logits.size(-1)), "
        "targets.reshape(-1))。",
    ),
    (  # raised in the learner's body: a call on that line (a binding error: _SIGNATURE)
        r"^TypeError: .*\b(argument|positional)",
        "出错的那一行调用的函数不接受这样的参数（个数、类型或关键字不对）："
        "对照这个函数的文档检查这一行。例如 torch.cat、torch.stack 要的是一个"
        "张量的列表：torch.cat([a, b], dim=-1)，不是 torch.cat(a, b)。",
    ),
    (
        r"(?i)\b(sizes?|shapes?|dimensions?|mat1|broadcast)\b",
        "形状对不上：在出错的那一行之前打印各个张量的 .shape，对照练习说明里的形状。",
    ),
    (
        r"expected scalar type|\bdtype\b|\b(Long|Float|Double|Half|Int)\b",
        "dtype 不一致（例如 float 和 long、float32 和 float64 混用）。",
    ),
]


# a TypeError with no frame of the learner's: the call to the learner's function (its
# __init__ or forward) did not bind, so the signature differs from the exercise's
_SIGNATURE = (
    r"^TypeError: .*\b(argument|positional)",
    "检查参数：函数（或 __init__、forward）的签名要与练习说明的一致。",
)


def _crash_message(
    err: BaseException, what: str, case: str, causes: Sequence[tuple[str, str]]
) -> str:
    """The learner's exception (type, message, the learner's line) and its likely
    cause: a topic's ``causes`` first, then (a call that did not bind) the signature,
    then the general :data:`CRASH_CAUSES`."""
    where, line = _user_frame(err)
    error = f"{type(err).__name__}: {err}"
    candidates = [(p, h, f"{error}\n{line}") for p, h in causes]
    if not where:
        candidates.append((*_SIGNATURE, error))
    candidates += [(p, h, error) for p, h in CRASH_CAUSES]
    hint = next((h for p, h, text in candidates if re.search(p, text, re.M)), "")
    return (
        f"{what} 运行出错{f'（{case}）' if case else ''}：{error}"
        + (f"\n出错的位置：{where}" + (f"：{line}" if line else "") if where else "")
        + (f"\n可能的原因：{hint}" if hint else "")
    )


def _is_skeleton(err: NotImplementedError) -> bool:
    """The learner's own ``raise NotImplementedError`` (a skeleton), not one from torch
    (``bool @ bool``: "... not implemented for 'Bool'") inside code already written."""
    _, line = _user_frame(err)
    return not err.args or line.startswith("raise NotImplementedError")


def copies(args: tuple) -> tuple:
    """Clones of the tensors in ``args``; a tensor passed twice gives one clone, passed
    twice (``f(x, x, x)`` stays self-attention, so an in-place edit of Q shows in K)."""
    memo: dict[int, Tensor] = {}
    return tuple(
        memo.setdefault(id(a), a.clone()) if isinstance(a, Tensor) else a for a in args
    )


def run_learner(
    fn: Callable,
    *args,
    what: str,
    case: str = "",
    first: bool = False,
    causes: Sequence[tuple[str, str]] = (),
    copy_inputs: bool = True,
    **kwargs,
):
    """Call the learner's ``fn``; a crash becomes an :class:`ExerciseError` naming the
    inputs; ``NotImplementedError`` (or ``None`` from a ``first`` call) a skeleton.
    ``copy_inputs=False``: the caller passes its own copies, to see in-place edits."""
    # the learner's code may change its inputs in place: it gets copies, and a
    # layer that edits its input is named (the page's next layer reads that tensor)
    given = args
    if copy_inputs:
        args = copies(args)
    try:
        out = fn(*args, **kwargs)
    except NotImplementedError as err:
        if _is_skeleton(err):
            raise Skeleton(what, "抛出了 NotImplementedError") from None
        raise ExerciseError(_crash_message(err, what, case, causes)) from None
    except (ExerciseError, Skeleton):
        raise
    except Exception as err:  # the learner's bug: say where and on what
        raise ExerciseError(_crash_message(err, what, case, causes)) from None
    if out is None:
        if first:
            raise Skeleton(what, "返回了 None——还没写完，或者忘了 return")
        where = f"（{case}）" if case else ""
        fail(f"{what} 返回了 None{where}：这种情况下也要返回结果，是不是漏了 return？")
    if copy_inputs and isinstance(getattr(fn, "__self__", fn), nn.Module):
        _refuse_edited_inputs(given, args, what, case)  # a layer's forward: x += ...
    return out


def _refuse_edited_inputs(given: tuple, passed: tuple, what: str, case: str) -> None:
    """Fail when the learner's code changed a tensor it was passed (``x += ...``)."""
    for i, (a, b) in enumerate(zip(given, passed, strict=True)):
        if not isinstance(a, Tensor) or a is b:
            continue
        if a.shape == b.shape and a.dtype == b.dtype:
            if not a.is_floating_point() and torch.equal(a, b):
                continue
            if a.is_floating_point() and torch.equal(a.isnan(), b.isnan()):
                if torch.equal(a.nan_to_num(), b.nan_to_num()):
                    continue
        where = f"；{case}" if case else ""
        fail(
            f"{what} 原地改动了传进来的第 {i + 1} 个张量参数{where}：例如 x += …、"
            "x -= …、x[...] = …、masked_fill_ 之类带下划线的函数。调用方的张量被改掉，"
            "页面后面的单元格会用到改过的值，反向传播也会报错。改成 x = x + …，"
            "或先 clone() 再改。"
        )


@contextmanager
def calls_refused(
    functions: Sequence[Callable],
    message: str,
    when: Mapping[Callable, Callable[[Mapping[str, object]], bool]] | None = None,
) -> Iterator[None]:
    """Fail with ``message`` if the code run inside calls one of ``functions`` (the
    reference an exercise asks the learner to write by hand). A profile hook watches
    for their code objects, so every way to reach them counts: ``tc.f``, a name
    imported with ``from ... import f``, a wrapper. ``when`` maps one of
    ``functions`` to a test of its arguments (by parameter name): a call to it counts
    only where the test is true (``F.cross_entropy`` with ``label_smoothing`` set).
    A C function among ``functions`` (``torch.layer_norm``) counts at every call made
    from Python code. A crash after such a call is reported as the call."""
    codes = {f.__code__ for f in functions if hasattr(f, "__code__")}
    builtins = [f for f in functions if not hasattr(f, "__code__")]
    tests = {f.__code__: test for f, test in (when or {}).items()}
    called: list[str] = []

    def watch(frame, event: str, arg: object) -> None:
        if event == "c_call" and any(arg is f for f in builtins):
            called.append(getattr(arg, "__name__", repr(arg)))
        if event != "call" or frame.f_code not in codes:
            return
        test = tests.get(frame.f_code)
        if test is None or test(frame.f_locals):
            called.append(frame.f_code.co_name)

    previous = sys.getprofile()
    sys.setprofile(watch)
    try:
        yield
    except ExerciseError:
        if not called:
            raise
    finally:
        sys.setprofile(previous)
    if called:
        fail(message)


class CallWatch(TorchFunctionMode):
    """``with CallWatch(test) as watch:`` runs the code inside unchanged and sets
    ``watch.seen`` once ``test(func, args, out)`` is true for one of its torch calls:
    ``func`` the torch function, ``args`` its positional arguments, ``out`` its
    result (what an exercise forbids: a product of two (L, L) masks, an (L, S) score
    matrix). ``test`` is not called again after that."""

    def __init__(self, test: Callable[[Callable, tuple, object], bool]) -> None:
        super().__init__()
        self.test, self.seen = test, False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.seen:
            self.seen = bool(self.test(func, args, out))
        return out


def ends_in(t: object, shape: tuple[int, ...]) -> bool:
    """Whether ``t`` is a tensor whose last dimensions are ``shape``."""
    return isinstance(t, Tensor) and tuple(t.shape[-len(shape) :]) == shape


def construct(cls: type, *args, what: str, **kwargs) -> nn.Module:
    """Build the learner's module; a skeleton ``__init__`` is fine (forward decides)."""
    obj = run_learner(
        cls, *args, what=f"{what}{fmt_args(args, kwargs)}", first=True, **kwargs
    )
    if not isinstance(obj, nn.Module):
        fail(
            f"{what} 应继承 nn.Module（class {what}(nn.Module): ...），"
            f"得到的对象类型是 {type(obj).__name__}。"
        )
    return obj


def fmt_args(args: tuple, kwargs: dict) -> str:
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return "(" + ", ".join(parts) + ")"


def run_module(
    module: nn.Module,
    *args,
    what: str,
    case: str = "",
    first: bool = False,
    causes: Sequence[tuple[str, str]] = (),
):
    """Call ``module(*args)``; an ``__init__`` without ``super().__init__()`` still
    reveals a skeleton ``forward`` (it is called directly then)."""
    if "_parameters" not in module.__dict__:  # nn.Module.__init__ never ran
        out = run_learner(
            type(module).forward,
            module,
            *args,
            what=f"{what}.forward",
            case=case,
            first=first,
            causes=causes,
        )
        fail(
            f"{what}.__init__ 里没有调用 super().__init__()：nn.Module 的子类必须先"
            "调用它，才能注册参数和子模块。"
        )
        return out
    return run_learner(
        module, *args, what=f"{what}.forward", case=case, first=first, causes=causes
    )
