"""Trajectory builders: a session's completion records in, trainer-ready traces out.

Reading a session (:mod:`~polar.trajectory.chains`): records are ordered by
sequence number; failed, aborted and superseded attempts are quarantined; every
remaining call gets a parent (the earlier call its prompt continues) and a
:class:`Relation` to it; calls form chains, cut into clean segments wherever a
link is not a pure token extension (:class:`BreakReason`). Chains are
classified (:mod:`~polar.trajectory.classify`) and each class has a training
policy. Builders (:mod:`~polar.trajectory.builders`): ``per_request`` and
``prefix_merge``. Every generated token ends up delivered or quarantined with a
reason (:class:`Accounting`); :mod:`~polar.trajectory.export` writes samples
to Parquet or JSONL and reads them back.
"""

from polar.trajectory.builders import (
    BUILDERS,
    BuildConfig,
    Builder,
    PerRequest,
    PrefixMerge,
    plan_session,
    resolve_builder,
)
from polar.trajectory.classify import (
    DEFAULT_POLICIES,
    ClassConfig,
    ClassPolicy,
    ClassRule,
    RuleTarget,
)
from polar.trajectory.errors import (
    BuildInputError,
    ExportError,
    TrajectoryError,
    UnknownBuilder,
)
from polar.trajectory.export import (
    Sample,
    SampleFormat,
    read_samples,
    row_of,
    sample_from_row,
    samples_of,
    write_samples,
)
from polar.trajectory.trace import (
    Accounting,
    BreakReason,
    Chain,
    ChainClass,
    Fate,
    RecordFate,
    Relation,
    Trace,
    Trajectory,
    TurnDrift,
    TurnSpan,
)
from polar.trajectory.turns import TurnFormat

__all__ = [
    "BUILDERS",
    "DEFAULT_POLICIES",
    "Accounting",
    "BreakReason",
    "BuildConfig",
    "BuildInputError",
    "Builder",
    "Chain",
    "ChainClass",
    "ClassConfig",
    "ClassPolicy",
    "ClassRule",
    "ExportError",
    "Fate",
    "PerRequest",
    "PrefixMerge",
    "RecordFate",
    "Relation",
    "RuleTarget",
    "Sample",
    "SampleFormat",
    "Trace",
    "Trajectory",
    "TrajectoryError",
    "TurnDrift",
    "TurnFormat",
    "TurnSpan",
    "UnknownBuilder",
    "plan_session",
    "read_samples",
    "resolve_builder",
    "row_of",
    "sample_from_row",
    "samples_of",
    "write_samples",
]
