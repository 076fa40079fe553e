"""Allow rules: blocking calls the user has decided not to be told about.

A rule names an event, a module, a file path prefix or a call site; it can be
global (`add_allow_rule`) or scoped (`allow_blocking`, a context manager and
decorator whose rules follow the context into tasks created inside it).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiocop._common.validate import F, check_decorated, did_you_mean
from aiocop._interception.rules import live_weights
from aiocop._interception.scope import ContextVarScope

if TYPE_CHECKING:
    from types import FrameType


@dataclass(frozen=True, slots=True)
class AllowRule:
    """A blocking call not to report.

    Every field that is set must match. `module`, `path` and `call_site` match
    when any frame of the step's stack (from the call up to the start of the
    task step or callback) matches them. A rule must say something: with no
    event and no other field it is refused (`ValueError`), because a blank
    rule read from a file or a flag would silently allow every blocking call.
    A rule that matches every call is written `AllowRule(everything=True)`.

    Attributes:
        events: Event names (e.g. `"open"`, `"os.stat"`); empty means any event.
        module: A module name; its submodules match too.
        path: A file path prefix, e.g. `"/app/vendor/"`.
        call_site: `"file.py:function"`: a frame of that function in a file
            whose path ends with `file.py`.
        everything: Match every blocking call (and nothing else may be set).

    Added in 2.0.
    """

    events: frozenset[str] = frozenset()
    module: str | None = None
    path: str | None = None
    call_site: str | None = None
    everything: bool = False
    _site_file: str = field(default="", init=False, repr=False, compare=False)
    _site_func: str = field(default="", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "events", _check_events(self.events))
        for name in ("module", "path", "call_site"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise TypeError(f"AllowRule.{name} must be a non-empty string, not {value!r}")
        if self.call_site is not None:
            file, sep, func = self.call_site.rpartition(":")
            if not sep or not file or not func:
                raise ValueError(f"AllowRule.call_site must look like 'file.py:function', not {self.call_site!r}")
            object.__setattr__(self, "_site_file", file.replace("/", os.sep))
            object.__setattr__(self, "_site_func", func)
        if not isinstance(self.everything, bool):
            raise TypeError(f"AllowRule.everything must be True or False, not {self.everything!r}")
        says_something = bool(self.events) or self.has_frame_condition
        if self.everything and says_something:
            raise ValueError(f"AllowRule(everything=True) matches every call: it takes no other field, got {self!r}")
        if not self.everything and not says_something:
            raise ValueError(EMPTY_RULE)

    def matches_frame(self, frame: FrameType) -> bool:
        module_globals = frame.f_globals
        if self.path is not None:
            file = module_globals.get("__file__")
            if not isinstance(file, str) or not file.startswith(self.path):
                return False
        if self.call_site is not None:
            code = frame.f_code  # an audit event of its own: only for call-site rules
            if not (code.co_name == self._site_func and code.co_filename.endswith(self._site_file)):
                return False
        if self.module is not None:
            name = module_globals.get("__name__")
            if not isinstance(name, str) or not (name == self.module or name.startswith(self.module + ".")):
                return False
        return True

    @property
    def has_frame_condition(self) -> bool:
        return self.module is not None or self.path is not None or self.call_site is not None


EMPTY_RULE = (
    "an allow rule needs an event name or module=, path= or call_site= (an empty rule would allow every "
    "blocking call); to allow every call, say so: everything=True (everything = true in [tool.aiocop])"
)


def _check_events(events: object) -> frozenset[str]:
    if isinstance(events, str) or not isinstance(events, Iterable):
        raise TypeError(
            f"events must be a collection of event names, not {type(events).__name__}: {events!r}"
            + (f" (write ({events!r},) for one name)" if isinstance(events, str) else "")
        )
    names = list(events)
    known = live_weights()
    for event in names:
        if not isinstance(event, str):
            raise TypeError(f"events must be event names (strings), not {type(event).__name__}: {event!r}")
        if event not in known:
            raise ValueError(
                f"unknown event {event!r} in allow rule{did_you_mean(event, known)}; known events are listed "
                "by aiocop.get_blocking_events_dict(), add your own with aiocop.register_blocking_event()"
            )
    return frozenset(names)


class ScopedRules(tuple[AllowRule, ...]):
    """The allow rules of the scopes entered in a context, outermost first.

    Made once per content and kept (see `allow_blocking._value`): a scope
    entered again, per task or per request, finds the same object, and the
    matchers compiled for it are kept on it. Nothing is keyed by `id()`,
    an audited builtin: each call of it runs every audit hook.
    """

    def __init__(self, rules: Iterable[AllowRule] = ()) -> None:
        # event -> Matcher of the global rules plus these (None: no rule names
        # the event), valid while the global rules are those of `generation`.
        self.matchers: dict[str, Matcher | None] = {}
        self.generation = -1
        # allow_blocking's content key -> this tuple extended with its rule.
        self.children: dict[object, ScopedRules] = {}


_global_rules: tuple[AllowRule, ...] = ()
# Bumped whenever the global rules change: every matcher compiled before is stale.
_generation = 0
NO_RULES = ScopedRules()
scoped_rules: ContextVar[tuple[AllowRule, ...]] = ContextVar("aiocop_allow_rules", default=NO_RULES)


class Matcher:
    """The allow rules that can match one event, compiled for the hook's walk up the stack.

    The hook asks `frame_allowed` of each frame of the step as it walks, and
    stops at the first that matches: an allowed call costs the walk to the
    frame that allows it, and no more. What a module-only or a path-only
    rule says of a frame depends on the frame's module name or file alone,
    so it is worked out once per module (or file) and cached.
    """

    __slots__ = ("always", "by_file", "by_name", "modules", "other", "paths")

    def __init__(self, rules: Iterable[AllowRule], event: str) -> None:
        rules = [rule for rule in rules if not rule.events or event in rule.events]
        # A rule with no frame condition allows the event wherever it is made.
        self.always = any(not rule.has_frame_condition for rule in rules)
        # Rules with one frame condition, module or path, are decided per
        # module name or file and cached; the others frame by frame.
        self.modules = tuple(r.module for r in rules if r.module is not None and r.path is None and r.call_site is None)
        self.paths = tuple(r.path for r in rules if r.path is not None and r.module is None and r.call_site is None)
        self.other = tuple(r for r in rules if r.call_site is not None or (r.module is not None and r.path is not None))
        self.by_name: dict[object, bool] = {}
        self.by_file: dict[object, bool] = {}

    def frame_allowed(self, frame: FrameType, name: object) -> bool:
        """Whether a rule matches this frame of the step (`name`: its module's name)."""
        if self.modules:
            hit = self.by_name.get(name)
            if hit is None:
                hit = _module_matches(name, self.modules)
                _remember(self.by_name, name, hit)
            if hit:
                return True
        if self.paths:
            file = frame.f_globals.get("__file__")
            hit = self.by_file.get(file)
            if hit is None:
                hit = isinstance(file, str) and file.startswith(self.paths)
                _remember(self.by_file, file, hit)
            if hit:
                return True
        return bool(self.other) and _any_frame_match(self.other, frame)


# The generator expressions of `frame_allowed`, apart: in its body, each
# would make a closure cell at every call, matched or not.
def _module_matches(name: object, modules: tuple[str, ...]) -> bool:
    return isinstance(name, str) and any(name == m or name.startswith(m + ".") for m in modules)


def _any_frame_match(rules: tuple[AllowRule, ...], frame: FrameType) -> bool:
    return any(rule.matches_frame(frame) for rule in rules)


_MAX_CACHED = 4096  # modules or files per matcher; templating engines make modules without end


def _remember(cache: dict[object, bool], key: object, hit: bool) -> None:
    if len(cache) >= _MAX_CACHED:
        cache.clear()
    cache[key] = hit


# event -> Matcher of the global rules (None: no rule names the event).
# Emptied whenever the global rules change.
_global_matchers: dict[str, Matcher | None] = {}


def matcher(event: str, scoped: tuple[AllowRule, ...]) -> Matcher | None:
    """The compiled allow rules, global and `scoped`, for `event`; None if none can match it."""
    if not scoped:
        by_event = _global_matchers
    elif type(scoped) is ScopedRules:
        if scoped.generation != _generation:
            scoped.matchers = {}
            scoped.generation = _generation
        by_event = scoped.matchers
    else:
        by_event = {}  # rules set by hand, not by a scope: compiled, not kept (nothing in aiocop does this)
    compiled = by_event.get(event, _UNSET)
    if compiled is _UNSET:
        compiled = Matcher((*_global_rules, *scoped), event)
        if not (compiled.always or compiled.modules or compiled.paths or compiled.other):
            compiled = None
        by_event[event] = compiled
    return compiled  # type: ignore[return-value]


_UNSET: object = object()


def _rules_changed() -> None:
    global _generation
    _global_matchers.clear()
    _generation += 1


def add_allow_rule(
    *events: str | AllowRule,
    module: str | None = None,
    path: str | None = None,
    call_site: str | None = None,
    everything: bool = False,
) -> AllowRule:
    """Stop reporting matching blocking calls everywhere.

    Pass an `AllowRule`, or the fields of one: `add_allow_rule("open",
    module="myapp.templates")`. Returns the rule, for `remove_allow_rule`.
    A call with nothing to match (`add_allow_rule()`) raises `ValueError`:
    allowing every blocking call is written `add_allow_rule(everything=True)`.
    Added in 2.0.

    Args:
        events: Event names, or one `AllowRule` (then nothing else); none means any event.
        module: A module name; its submodules match too.
        path: A file path prefix, e.g. `"/app/vendor/"`.
        call_site: `"file.py:function"`: a frame of that function in a file whose path ends with `file.py`.
        everything: Allow every blocking call, everywhere (nothing else may be given).
    """
    global _global_rules
    if len(events) == 1 and isinstance(events[0], AllowRule):
        if module is not None or path is not None or call_site is not None or everything is not False:
            raise TypeError("add_allow_rule takes either one AllowRule or the fields of one, not both")
        rule = events[0]
    else:
        if any(isinstance(e, AllowRule) for e in events):
            raise TypeError("add_allow_rule takes either one AllowRule or event names")
        rule = AllowRule(_check_events(events), module, path, call_site, everything)
    _global_rules = (*_global_rules, rule)
    _rules_changed()
    return rule


def remove_allow_rule(rule: AllowRule) -> None:
    """Remove a rule added by `add_allow_rule`. Added in 2.0."""
    global _global_rules
    if not isinstance(rule, AllowRule):
        raise TypeError(f"rule must be an AllowRule (as add_allow_rule returns), not {type(rule).__name__}: {rule!r}")
    _global_rules = tuple(r for r in _global_rules if r is not rule)
    _rules_changed()


def clear_allow_rules() -> None:
    """Remove every global allow rule. Added in 2.0."""
    global _global_rules
    _global_rules = ()
    _rules_changed()


def get_allow_rules() -> list[AllowRule]:
    """The global allow rules, in the order they were added. Added in 2.0."""
    return list(_global_rules)


class allow_blocking(ContextVarScope[tuple[AllowRule, ...]]):  # noqa: N801 - reads as a verb
    """Allow blocking calls inside a block, function or coroutine function.

    ```python
    with aiocop.allow_blocking("open"):
        config = load_config()

    @aiocop.allow_blocking(module="legacy_sdk")
    async def handler(): ...
    ```

    With no argument at all every blocking call is allowed inside the scope
    (the scope is what says so; `everything=True` says it again). Tasks
    created inside the scope inherit it. Added in 2.0.

    Args:
        events: Event names; none means any event.
        module: A module name; its submodules match too.
        path: A file path prefix, e.g. `"/app/vendor/"`.
        call_site: `"file.py:function"`: a frame of that function in a file whose path ends with `file.py`.
        everything: Allow every blocking call in the scope, as no argument at all does.
    """

    def __init__(
        self,
        *events: str,
        module: str | None = None,
        path: str | None = None,
        call_site: str | None = None,
        everything: bool = False,
    ) -> None:
        # A scope is often made where it is entered (`with allow_blocking(...)`
        # in a handler): its rule is built and checked once per content, not
        # at every entry. Most name events only, and are known by the names
        # alone (no key to build and hash). A kept rule stands while its
        # events are detected ones: the table losing an event forgets every
        # kept rule (forget_kept_scopes), so that none is checked here.
        if module is None and path is None and call_site is None and everything is False:
            try:
                spec = _scope_events.get(events)
            except TypeError:  # an unhashable argument: the checks below say what is wrong with it
                spec = None
            if spec is not None:
                self._var = scoped_rules
                self.rule = spec.rule
                self._key: _Spec | None = spec
                return
        if len(events) == 1 and callable(events[0]):
            raise TypeError(
                "events must be event names, not a function: decorate with @aiocop.allow_blocking(), "
                "not @aiocop.allow_blocking"
            )
        self._var = scoped_rules  # ContextVarScope.__init__, inline
        # Any other content is known by all that was passed; `everything` only
        # as a real bool (0 == False would otherwise skip its check).
        only_events = module is None and path is None and call_site is None and everything is False
        cache = _scope_events if only_events else _scope_rules
        key: object = events if only_events else (events, module, path, call_site, everything)
        spec = None
        if everything is False or everything is True:
            try:
                spec = cache.get(key)
            except TypeError:  # an unhashable argument: the checks below say what is wrong with it
                key = None
        else:
            key = None
        if spec is None:
            spec = _Spec(self._build(events, module, path, call_site, everything))
            if key is not None:
                if len(cache) >= _MAX_CACHED:
                    cache.clear()
                cache[key] = spec
        self.rule = spec.rule
        # What the enclosing scopes' cache knows this scope's content by: the
        # kept spec, hashed by identity (the content tuple would be hashed
        # again at every entry), or None when the content is not cacheable.
        self._key = spec if key is not None else None

    @staticmethod
    def _build(
        events: tuple[str, ...], module: str | None, path: str | None, call_site: str | None, everything: bool
    ) -> AllowRule:
        checked = _check_events(events)
        if everything is False and not (checked or module is not None or path is not None or call_site is not None):
            everything = True  # `with allow_blocking():` -- the scope itself is the explicit part
        return AllowRule(checked, module, path, call_site, everything)

    def _value(self) -> tuple[AllowRule, ...]:
        # The enclosing scopes' rules and this one's, the same object each
        # time for the same content: what is compiled for it is kept on it.
        parent = scoped_rules.get()
        key = self._key
        if type(parent) is not ScopedRules or key is None:
            return ScopedRules((*parent, self.rule))
        child = parent.children.get(key)
        if child is None:
            if len(parent.children) >= _MAX_CHILDREN:
                parent.children.clear()
            child = parent.children[key] = ScopedRules((*parent, self.rule))
        return child

    def __call__(self, func: F) -> F:
        return super().__call__(check_decorated("allow_blocking()", func))


class _Spec:
    """An `allow_blocking` content's checked rule, kept per content; hashed by identity."""

    __slots__ = ("rule",)

    def __init__(self, rule: AllowRule) -> None:
        self.rule = rule


# allow_blocking's arguments -> its checked rule (see allow_blocking.__init__):
# its event names when it was given nothing else, else all it was given.
_scope_events: dict[object, _Spec] = {}
_scope_rules: dict[object, _Spec] = {}
_MAX_CHILDREN = 256  # scopes of distinct content entered inside one scope before its cache starts over


def forget_kept_scopes() -> None:
    """Forget the kept scope rules, as the table of detected events loses events (`_api`).

    A kept rule was checked when it was built: every event it names was detected then. Once one may no
    longer be, each content is built and checked again when next made (and refused if it names the event).
    """
    _scope_events.clear()
    _scope_rules.clear()
