"""Persistent state: jobs, instances, launch decisions, events (market history is derived from instances).

SQLite by default (any SQLAlchemy URL works). The schema evolves by Alembic migrations
(``migrate.py``, ``migrations/versions/``): a change here needs a revision there. Every job
transition is an event row with a timestamp and a reason. A launch *decision* is written before the
cloud is asked, so a controller that crashes between asking and recording can find the instance by
its decision tag and never launches twice.
"""

from __future__ import annotations

import time

from sqlalchemy import BigInteger, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from autoscaler.jobs.domain import TERMINAL, JobState

__all__ = ["TERMINAL", "JobState", "Base", "Job", "Gang", "InstanceRow", "Decision", "Event", "AGENT_TABLE_NAMES"]

# The remote executor's tables: Alembic branch ``agents`` (``migrate.py``); every other table is ``state``.
AGENT_TABLE_NAMES = frozenset({"agent_assignments", "agent_reports", "agent_seqs", "agent_progress"})


class Base(DeclarativeBase):
    pass


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        # The tick's queries touch live jobs only, not every job ever submitted (issue 14, finding 5).
        Index("ix_jobs_controller_state", "controller_id", "state"),
        # Lists page in submission order (issue 21, finding 7): a page's ids are found (and, for
        # several states, sorted) in these covering indexes, never by sorting whole rows.
        Index("ix_jobs_state_submitted", "state", "submitted_at", "job_id"),
        Index("ix_jobs_submitted", "submitted_at", "job_id"),
    )

    job_id: Mapped[str] = mapped_column(String(80), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), index=True)
    controller_id: Mapped[str] = mapped_column(String(80), index=True)
    cloud: Mapped[str] = mapped_column(String(16))
    spec_json: Mapped[str] = mapped_column(Text)
    workdir: Mapped[str] = mapped_column(Text)
    checkpoint_uri: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(24), default=JobState.PENDING.value, index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    submitted_at: Mapped[float] = mapped_column(Float, default=time.time)
    submitted_clock_s: Mapped[float] = mapped_column(Float, default=0.0)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # When the job ended on the provider's clock (submitted_clock_s's clock): deadlines are kept there.
    finished_clock_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    restarts_on_errors: Mapped[int] = mapped_column(Integer, default=0)
    # How many gangs in a row were lost before any progress.
    stalled_restarts: Mapped[int] = mapped_column(Integer, default=0)
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    on_demand_cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    step: Mapped[int] = mapped_column(BigInteger, default=0)
    total_steps: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    metric: Mapped[float | None] = mapped_column(Float, nullable=True)
    metric_name: Mapped[str] = mapped_column(String(64), default="")
    loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    final_model: Mapped[str | None] = mapped_column(Text, nullable=True)
    last_checkpoint_step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # Measured seconds (wall) from a gang stop to training running again; feeds the policy.
    restart_overhead_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    scenario_json: Mapped[str] = mapped_column(Text, default="")
    # What the workers reported of the job's speed (issue 11): the profile, one row per configuration
    # (JSON list of {nodes, replicas, local_bsz, accum_steps, step_time_s, sync_time_s}), and the
    # gradient statistics at the initial batch size; the controller fits its goodput model to them.
    profile_json: Mapped[str] = mapped_column(Text, default="")
    grad_sqr: Mapped[float | None] = mapped_column(Float, nullable=True)
    grad_var: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The batch configuration the running (or last) gang was told to train with (JSON; "" = the spec's).
    batch_json: Mapped[str] = mapped_column(Text, default="")
    # A cancel asked of a standby controller of the fleet (its reason); the leader cancels the job on
    # its next tick (docs/architecture.md, "High availability").
    cancel_requested: Mapped[str] = mapped_column(Text, default="", server_default="")
    # The job's checkpoint key (hex), issued at submit and given to its workers as
    # SPOTRAIN_CHECKPOINT_KEY: they sign their manifests with it and refuse unsigned or forged ones
    # (issue 21, finding 9). "" for a job submitted before keys: it stays unsigned. A secret: never in
    # events, logs or API answers.
    checkpoint_key: Mapped[str] = mapped_column(Text, default="", server_default="")
    # Moves of the job's state to another region or cloud (issue 23): where its state lives now
    # (``cloud/region`` of the gang that last ran; "" before the first gang), the checkpoint's size
    # the runtime measured (GB; None until it has checkpointed: the spec's ``checkpoint.size_gb``
    # stands in), the egress billed for the moves (counted into ``cost_usd``, so the hard budget)
    # and how many there were.
    state_location: Mapped[str] = mapped_column(String(160), default="", server_default="")
    checkpoint_size_gb: Mapped[float | None] = mapped_column(Float, nullable=True)
    egress_usd: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    region_moves: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The job's gang (its own table, ``gangs``), loaded with the job: a job read in one session is
    # used after it closes (``expire_on_commit=False``).
    gang_row: Mapped[Gang | None] = relationship(lazy="selectin", cascade="all, delete-orphan")

    @property
    def gang(self) -> Gang:
        """The job's current (or last) gang; a job that has had none gets its empty record here (a job
        written before the ``gangs`` table, or inserted in bulk, has no row until then)."""
        if self.gang_row is None:
            self.gang_row = Gang(job_id=self.job_id, attempt=0, port=0, stopping="", start_step=0)
        return self.gang_row


class Gang(Base):
    """The gang of workers a job runs now or ran last: one row per job (``Job.gang``). Its own table,
    not columns of ``jobs`` (issue 22): what changes with every gang start and stop is apart from
    what describes the job."""

    __tablename__ = "gangs"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"), primary_key=True)
    # Attempt whose workers are running now (0: none).
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    # The rendezvous port rank 0 listens on for this attempt.
    port: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Set once a stop directive was sent to the running gang (rescale/cancel), with its reason.
    stopping: Mapped[str] = mapped_column(String(32), default="")
    # Wall time by which a gang told to stop must have exited; past it the controller stops it.
    stop_deadline: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The job's step when this gang started (progress past it means the gang was not stalled).
    start_step: Mapped[int] = mapped_column(BigInteger, default=0)


class InstanceRow(Base):
    __tablename__ = "instances"

    instance_id: Mapped[str] = mapped_column(String(80), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"), index=True)
    cloud: Mapped[str] = mapped_column(String(16))
    offering_key: Mapped[str] = mapped_column(String(160))
    market: Mapped[str] = mapped_column(String(16))
    region: Mapped[str] = mapped_column(String(64), default="")
    # The tags the cloud reported at launch (providers bill from them, e.g. AWS's launch-price tag).
    tags_json: Mapped[str] = mapped_column(Text, default="{}")
    gpus: Mapped[int] = mapped_column(Integer, default=1)
    state: Mapped[str] = mapped_column(String(16), index=True)
    decision_id: Mapped[str] = mapped_column(String(80), index=True)
    launched_at_s: Mapped[float] = mapped_column(Float)
    terminated_at_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    interruption: Mapped[str | None] = mapped_column(String(64), nullable=True)
    notice_delivered: Mapped[int] = mapped_column(Integer, default=0)
    # Gang attempt this instance's workers belong to (0: no workers started), and its first rank.
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    first_rank: Mapped[int] = mapped_column(Integer, default=0)
    billed_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    on_demand_cost_usd: Mapped[float] = mapped_column(Float, default=0.0)


class Decision(Base):
    """A launch the controller decided on, written before the cloud is asked (write-ahead)."""

    __tablename__ = "decisions"
    __table_args__ = (Index("ix_decisions_status", "status"),)  # the pending ones, each tick

    decision_id: Mapped[str] = mapped_column(String(80), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"), index=True)
    offering_key: Mapped[str] = mapped_column(String(160))
    market: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Float, default=time.time)
    # pending -> launched (instance_id set) | failed (reason set)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    instance_id: Mapped[str | None] = mapped_column(String(80), nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")


class Event(Base):
    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"), index=True)
    ts: Mapped[float] = mapped_column(Float, default=time.time)
    kind: Mapped[str] = mapped_column(String(32))
    from_state: Mapped[str] = mapped_column(String(24), default="")
    to_state: Mapped[str] = mapped_column(String(24), default="")
    reason: Mapped[str] = mapped_column(Text, default="")


# ----- the remote executor's tables (autoscaler/remote/executor.py): workers on real instances -----


class AgentAssignment(Base):
    """What an instance's agent must run: the latest gang attempt assigned to it, the directive for
    that attempt, and up to which attempt its workers must be killed."""

    __tablename__ = "agent_assignments"

    instance_id: Mapped[str] = mapped_column(String(80), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(80), index=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    launch_json: Mapped[str] = mapped_column(Text, default="")
    notice_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    stop_attempt: Mapped[int] = mapped_column(Integer, default=0)
    assigned_at: Mapped[float] = mapped_column(Float, default=time.time)


class AgentReport(Base):
    """The latest report of an instance's agent (controller clock)."""

    __tablename__ = "agent_reports"

    instance_id: Mapped[str] = mapped_column(String(80), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[str] = mapped_column(String(16), default="idle")
    exit_codes_json: Mapped[str] = mapped_column(Text, default="{}")
    notice_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    address: Mapped[str | None] = mapped_column(String(64), nullable=True)
    first_report_at: Mapped[float] = mapped_column(Float, default=time.time)
    reported_at: Mapped[float] = mapped_column(Float, default=time.time)


class AgentSeq(Base):
    """The highest request counter taken from each launch decision's agent: a signed request is taken
    once, with a counter above this (``autoscaler/remote/auth.py``), so a replayed one is refused."""

    __tablename__ = "agent_seqs"

    decision_id: Mapped[str] = mapped_column(String(80), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, default=0)


class AgentProgress(Base):
    """Rank 0's last progress report per job, as its agent relayed it."""

    __tablename__ = "agent_progress"

    job_id: Mapped[str] = mapped_column(String(80), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    progress_json: Mapped[str] = mapped_column(Text, default="{}")
    reported_at: Mapped[float] = mapped_column(Float, default=time.time)


class ProgressSample(Base):
    """The job's step when a new checkpoint became durable (the controller saw it): the history of
    progress that ``spotrain report`` plots and ``spotrain resume`` names."""

    __tablename__ = "progress_samples"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(80), index=True)
    # Controller clock, and the provider's clock (the one deadlines and instance times are on).
    ts: Mapped[float] = mapped_column(Float, default=time.time)
    clock_s: Mapped[float] = mapped_column(Float, default=0.0)
    step: Mapped[int] = mapped_column(BigInteger, default=0)
    checkpoint_step: Mapped[int] = mapped_column(BigInteger, default=0)
