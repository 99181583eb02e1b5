"""How one step of train-local moves between our modules: one real train-local run of one step
(embedded engine, the tiny model built offline, the fixture task, native agent, local sandbox,
n_samples 2, one update, 16 tokens), traced on the main thread with sys.setprofile from the
loop's entry (trainers/loop.py's train_loop) to its end. Only frames of slime_harbor count;
the trainer's update runs in a worker thread and is not traced (it is one call down, learner.py).

    .venv/bin/python bench/trace_step.py [--nodes] [--show-walk]

A module is a file of the package (`rollout`, `trainers.loop`); with --nodes, docs/chain.md's
layer nodes (a folder is one node, as tests/test_layers.py counts them). Figures:

- modules entered: the modules any traced call ran in.
- returns to a module already left: the walk is the module of the innermost slime_harbor frame
  after each call and return, runs of one module collapsed. Control returns to a module M already
  left when the walk enters M again by a call (a fresh call, or the event loop resuming one of M's
  coroutines), not when a callee M called returns into M: reaching M again only by calls is the
  step going back up to code it had left, instead of reading on downwards. Per module, top 10.
  ("fresh": the same without the event loop's resumptions, i.e. only calls written in our code.)
- calls up: a fresh call into M from another module while a frame of M is still on the stack
  below (a callback handed down, a lower module calling its caller): zero when every module calls
  only down.
- reading order: each function listed once, where the step first calls it; a module comes back
  when the list returns to it after another module (how often a reader reading the step in the
  order it runs turns back to a file already open).

Issue 48 measured 24 modules entered and 58 returns (rollout 16, loop 12) with a trace whose
definition it did not give; this one, on the same main, enters 24 nodes (--nodes) or 47 files,
and counts far more returns by the walk (every await resumed is counted), so compare runs of this
script with each other only. The figures move by a few returns from run to run (how the sandbox's
awaits interleave), so a difference under about 5 is noise.

Figures (files | nodes): entered, returns (fresh), calls up, reading-order turn-backs.

    before the moves                  47, 606-609 (310-312), 8, 109 | 24, 487-492 (209), 5, 82
    rollout.runner_rollouts           47, 610 (309), 8, 110         | 24, 490 (208), 5, 83
    Learner.serving_frozen            47, 604 (309), 8, 110         | 24, 490 (208), 5, 83
    canary stream and groups moved    47, 608 (310), 8, 111         | 24, 490 (208), 5, 83

The moves do not show here, and cannot: run_config.with_engine runs in a worker thread (not
traced), and this step has no evaluation and no canaries, so evaluate_frozen and the canary
helpers never run in it. They make trainers/loop.py call only down (it no longer calls run_config,
builds no engine or server, discovers no tasks) without changing what one such step executes.

What remains, and why:
- calls up: 8 per file, all into environments.bubblewrap. Six are Harbor's BaseEnvironment.__init__
  (reached through environments.abilities' __init__, super().__init__) calling the overrides
  _validate_definition, resource_capabilities and type: Harbor's template methods, not ours to
  change. Two are environments.bubblewrap_files (a mixin of the same class, cut out for length)
  calling the class's _check: fixable, by giving the file side its own command runner or by
  folding it back into the class. None is an asyncio protocol callback.
- calls up per node (trainers/ 5) and most returns: the loop's coroutines (GroupProducer's groups
  and trials, the update awaited in a thread) resumed by the event loop that exits.SignalGuard.run
  starts; an async loop is read that way, and the walk counts each resumption.
- reading order in trainers.loop (11): GroupProducer and take_groups stay in the loop (they are
  its own scheduling, calling rollout.run_episode, filters and training_run); a file of their own
  would add a file to turn back to, not remove one.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "slime_harbor"
FIXTURE_TASKS = REPO / "tests" / "fixtures" / "tasks"
GENERATOR_FLAGS = 0x20 | 0x80 | 0x200  # CO_GENERATOR, CO_COROUTINE, CO_ASYNC_GENERATOR


def module_of(filename: str) -> str | None:
    """`trainers.loop` for slime_harbor/trainers/loop.py; None outside the package."""
    path = Path(filename)
    if not path.is_relative_to(PACKAGE):
        return None
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__") or "__init__"


def layer_node(module: str) -> str:
    """tests/test_layers.py's node: a top-level module, or its folder ("policy/")."""
    first = module.split(".")[0]
    return first + "/" if (PACKAGE / first).is_dir() else first


class Trace:
    """The main thread's call and return events in slime_harbor frames, from the loop's entry:
    (event, module, function, resumed, modules of the slime_harbor frames below, innermost first)."""

    def __init__(self, start: str = "train_loop"):
        self.start, self.started = start, False
        self.events: list[tuple[str, str, str, bool, list[str]]] = []
        self._seen_frames: dict[int, object] = {}  # held, so an id is never reused by another frame

    def __call__(self, frame, event, arg) -> None:
        if event not in ("call", "return"):
            return
        module = module_of(frame.f_code.co_filename)
        if module is None:
            return
        if not self.started:
            if event != "call" or frame.f_code.co_name != self.start:
                return
            self.started = True
        resumed = False
        if event == "call" and frame.f_code.co_flags & GENERATOR_FLAGS:
            resumed = id(frame) in self._seen_frames
            self._seen_frames[id(frame)] = frame
        below = []
        outer = frame.f_back
        while outer is not None:
            if (m := module_of(outer.f_code.co_filename)) is not None:
                below.append(m)
            outer = outer.f_back
        self.events.append((event, module, frame.f_code.co_qualname, resumed, below))


def figures(events, node=lambda m: m) -> dict:
    calls = [e for e in events if e[0] == "call"]
    walk: list[tuple[str, bool, bool]] = []  # (module, entered by a call, by a fresh call)
    for event, module, _, resumed, below in events:
        here = node(module) if event == "call" else (node(below[0]) if below else None)
        if here is not None and (not walk or walk[-1][0] != here):
            walk.append((here, event == "call", event == "call" and not resumed))
    returns, fresh_returns, seen = Counter(), Counter(), set()
    for here, by_call, by_fresh_call in walk:
        if here in seen and by_call:
            returns[here] += 1
            fresh_returns[here] += by_fresh_call
        seen.add(here)
    up = Counter()
    for _, module, _, resumed, below in calls:
        stack = [node(m) for m in below]
        if not resumed and stack and stack[0] != node(module) and node(module) in stack:
            up[node(module)] += 1
    order, listed = [], set()
    for _, module, function, _, _ in calls:
        if (module, function) not in listed:
            listed.add((module, function))
            order.append(node(module))
    reading, opened = Counter(), set()
    for i, m in enumerate(order):
        if m in opened and order[i - 1] != m:
            reading[m] += 1
        opened.add(m)
    return {"entered": len({node(e[1]) for e in calls}), "returns": returns, "fresh_returns": +fresh_returns,
            "calls_up": up, "reading_order": reading, "walk": [w[0] for w in walk]}


def traced_step(out: Path) -> list:
    from slime_harbor.policy.tiny_model import build_tiny_model
    from slime_harbor.trainers.local import train
    from slime_harbor.trainers.local_config import LocalTrainConfig

    model = build_tiny_model(out / "tiny_model", seed=0)
    cfg = LocalTrainConfig(tasks_dir=FIXTURE_TASKS, model=str(model), n_samples=2, num_rollouts=1,
                           updates_per_rollout=1, step_limit=1, max_new_tokens=16, output_dir=out / "run",
                           device="cpu")
    trace = Trace()
    sys.setprofile(trace)
    try:
        train(cfg)
    finally:
        sys.setprofile(None)
    return trace.events


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", action="store_true", help="count docs/chain.md's layer nodes, not files")
    p.add_argument("--show-walk", action="store_true", help="print the walk, one module a line")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="trace-step-") as out:
        events = traced_step(Path(out))
    f = figures(events, layer_node if args.nodes else lambda m: m)
    if args.show_walk:
        print("\n".join(f["walk"]))
    top = lambda c: ", ".join(f"{m} {n}" for m, n in c.most_common(10)) or "none"  # noqa: E731
    print(f"modules entered: {f['entered']}")
    print(f"returns to a module already left: {sum(f['returns'].values())} ({top(f['returns'])})")
    print(f"  of them by a fresh call: {sum(f['fresh_returns'].values())} ({top(f['fresh_returns'])})")
    print(f"calls up: {sum(f['calls_up'].values())} ({top(f['calls_up'])})")
    print(f"reading order, turns back: {sum(f['reading_order'].values())} ({top(f['reading_order'])})")


if __name__ == "__main__":
    main()
