"""``polar build``: turn a session's records into trainer samples (Parquet or JSONL)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
import yaml

from polar.cli.errors import fail
from polar.proxy.store import SqliteStore
from polar.proxy.store.sqlite import StoreError

if TYPE_CHECKING:
    from polar.tokenizer import Tokenizer
from polar.trajectory import (
    BuildConfig,
    ClassConfig,
    SampleFormat,
    Trajectory,
    TrajectoryError,
    TurnFormat,
    resolve_builder,
    samples_of,
    write_samples,
)


def build(
    session: Annotated[str, typer.Argument(help="Session id.")],
    store: Annotated[Path, typer.Option(help="SQLite record store the gateway wrote.")] = Path(
        "runs/gateway/records.db"
    ),
    builder: Annotated[
        str,
        typer.Option(help="per_request, prefix_merge, or a plug-in as package.module:factory."),
    ] = "prefix_merge",
    format: Annotated[
        SampleFormat | None,
        typer.Option(
            "--format", "-f", help="Sample file format.", show_default="from --output, else parquet"
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Sample file.",
            show_default="runs/trajectories/SESSION.BUILDER.FORMAT",
        ),
    ] = None,
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            help="Tokenizer directory with the chat template.", show_default="bundled Qwen3"
        ),
    ] = None,
    end_of_turn: Annotated[
        str | None,
        typer.Option(help="The token that ends a turn.", show_default="the tokenizer's eos"),
    ] = None,
    classes: Annotated[
        Path | None,
        typer.Option(help="YAML file with chain-class rules and per-class training policies."),
    ] = None,
    reward: Annotated[
        float | None, typer.Option(help="The session's outcome reward, scaled per chain class.")
    ] = None,
    group_id: Annotated[
        str | None,
        typer.Option(help="GRPO group id.", show_default="the session's group_id metadata"),
    ] = None,
    all_traces: Annotated[
        bool, typer.Option("--all-traces", help="Also write traces whose class is not trained.")
    ] = False,
) -> None:
    """Build SESSION's trajectory and write one sample per trace; print where its tokens went."""
    try:
        factory = resolve_builder(builder)
        class_config = _class_config(classes)
    except TrajectoryError as exc:
        fail("build", str(exc))
    fmt = _format(format, output)
    db = SqliteStore(store)
    try:
        row = db.session(session)
        if row is None:
            fail("build", f"no session {session!r} in {store}", code=1)
        records = db.records(session)
    except (StoreError, ValueError) as exc:
        fail("build", f"{store}: cannot read the session's records ({exc})", code=1)
    if not records:
        fail("build", f"session {session!r} has no records", code=1)
    metadata_group = row.metadata.get("group_id")
    group = group_id or (str(metadata_group) if metadata_group is not None else None)
    try:
        loaded = _tokenizer(tokenizer)
        turns = TurnFormat.from_tokenizer(loaded, end_of_turn=end_of_turn)
        config = BuildConfig(turns=turns, classes=class_config, decode=_decoder(loaded))
        trajectory = factory(config).build(records, group_id=group)
    except TrajectoryError as exc:
        fail("build", str(exc), code=1)
    if reward is not None:
        trajectory = trajectory.with_reward(reward)
    path = output or Path("runs/trajectories") / f"{session}.{trajectory.builder}.{fmt.value}"
    if output is None:
        path.parent.mkdir(parents=True, exist_ok=True)
    samples = samples_of(trajectory, include_untrainable=all_traces)
    if not samples:  # no file rather than an empty one a trainer would read as data
        typer.echo(_summary(trajectory, 0, None))
        return
    try:
        write_samples(samples, path, fmt)
    except TrajectoryError as exc:
        fail("build", str(exc), code=1)
    typer.echo(_summary(trajectory, len(samples), path))


def _format(given: SampleFormat | None, output: Path | None) -> SampleFormat:
    suffix = output.suffix.lstrip(".").lower() if output is not None else ""
    implied = next((f for f in SampleFormat if f.value == suffix), None)
    if given is not None and implied is not None and given is not implied:
        fail("build", f"--format {given.value} conflicts with the output file {output}")
    return given or implied or SampleFormat.PARQUET


def _class_config(path: Path | None) -> ClassConfig:
    if path is None:
        return ClassConfig()
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        fail("build", f"{path}: cannot read ({exc.strerror})")
    except yaml.YAMLError:
        fail("build", f"{path}: not valid YAML")
    return ClassConfig.from_mapping(data)


def _tokenizer(path: Path | None) -> Tokenizer:
    from polar.assets import QWEN3_TOKENIZER_DIR

    directory = path or QWEN3_TOKENIZER_DIR
    if not (directory / "tokenizer_config.json").is_file():
        fail("build", f"no tokenizer in {directory} (no tokenizer_config.json)")
    from polar.tokenizer import TokenizerLoadError, load_tokenizer

    try:
        return load_tokenizer(directory)
    except TokenizerLoadError as exc:
        fail("build", str(exc))


def _decoder(tokenizer: Tokenizer) -> Callable[[Sequence[int]], str]:
    from polar.proxy.render.tokens import TokenText

    return TokenText(tokenizer).decode


def _summary(trajectory: Trajectory, written: int, path: Path | None) -> str:
    accounting = trajectory.accounting
    wrote = (
        f"wrote {written} samples to {path}"
        if path is not None
        else "no sample to write, no file written (--all-traces writes untrained traces too)"
    )
    lines = [
        f"{trajectory.session_id}: {trajectory.builder}, {_n(len(trajectory.chains), 'chain')}, "
        f"{_n(len(trajectory.traces), 'trace')} ({len(trajectory.trainable)} trainable); " + wrote,
        f"delivered {accounting.delivered} of {accounting.captured} generated tokens "
        f"({100 * accounting.delivered_fraction:.1f}%)",
    ]
    for fate, tokens in sorted(accounting.quarantined.items()):
        lines.append(f"  quarantined {fate.value}: {tokens}")
    if accounting.missing_logprobs:
        lines.append(f"  delivered without rollout logprob: {accounting.missing_logprobs}")
    for why, tokens in sorted(accounting.unreproducible.items()):
        lines.append(
            f"  not trainable, sampling distribution unreproducible ({why.value}): {tokens}"
        )
    for reason, count in sorted(accounting.breaks.items()):
        lines.append(f"  breaks {reason.value}: {count}")
    if accounting.malformed_tool_calls:
        lines.append(f"  malformed tool calls (sent as text): {accounting.malformed_tool_calls}")
    for issue, count in sorted(accounting.delivery_flags.items()):
        lines.append(f"  delivery {issue.value}: {count}")
    relations = Counter(d.relation.value for d in trajectory.drift)
    lines.append("  prompts: " + ", ".join(f"{name} {n}" for name, n in sorted(relations.items())))
    for chain in trajectory.chains:
        lines.append(
            f"  chain {chain.index}: {chain.chain_class.value}, {_n(len(chain.records), 'call')} "
            f"({chain.classified_by})"
        )
    return "\n".join(lines)


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"
