"""ML over MCP: amfs_retrain, amfs_calibrate, amfs_export_training_data.

`register_ml_tools(mcp, ml, actors)` registers them; each is one `MLService` call, registered through
`ToolRegistry` so domain errors (not enough data: `InsufficientDataError`) become tool errors carrying
what is missing. The work runs off the event loop and reports MCP progress notifications as it goes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastmcp import Context, FastMCP
from pydantic import BaseModel, Field

from ..core.errors import ValidationError
from ..ml.export import ExportFormat
from ..ml.service import DEFAULT_EXPORT_LIMIT, MLService
from ._params import EntityFilter
from ._progress import ThreadProgress
from ._registry import ActorResolver, ToolRegistry, writes
from ._views import Score

ML_TOOLS = frozenset({"amfs_retrain", "amfs_calibrate", "amfs_export_training_data"})


class RetrainResult(BaseModel):
    num_samples: int
    num_positive: int
    num_negative: int
    accuracy: Score = Field(description="On held-out samples (the newest 20%).")
    feature_importances: dict[str, Score]
    trained_at: str
    entity_path: str | None = None
    num_outcome_linked: int
    num_never_linked: int
    num_holdout: int
    holdout_baseline_accuracy: Score
    holdout_auc: Score | None = None
    num_boost_rounds: int
    learned_weight: Score = Field(description="Share of retrieval fusion the learned strategy now has.")


class TypeSignalView(BaseModel):
    outcome_type: str
    num_outcomes: int
    num_links: int
    later_incident_rate: Score | None = None
    signal_strength: Score | None = None
    scale: float
    multiplier: float = Field(description="What the evidence supports: the configured value unless the change is significant.")
    calibrated: bool
    note: str | None = None
    proposed_multiplier: float | None = Field(None, description="The point estimate, before the evidence test.")
    multiplier_ci: tuple[float, float] | None = Field(None, description="95% bootstrap interval (over outcomes).")
    strength_ci: tuple[float, float] | None = None
    significant: bool = False


class MultiplierSetView(BaseModel):
    entity_path: str | None = None
    multipliers: dict[str, float]  # exact: they drive amfs_commit_outcome
    decay_half_life_days: float | None = None
    num_outcomes_analyzed: int
    signals: dict[str, TypeSignalView]


class CalibrateResult(BaseModel):
    global_multipliers: MultiplierSetView | None = Field(None, description="None after revert=true.")
    entity_multipliers: list[MultiplierSetView] = Field(default_factory=list)
    total_outcomes: int | None = None
    total_entries: int | None = None
    applied: bool = Field(description="True when the global multipliers now drive amfs_commit_outcome.")
    reverted: bool = False
    multipliers_in_force: dict[str, float]
    calibrated_at: str | None = None
    apply_refused: str | None = Field(None, description="Why apply=true changed nothing (no significant evidence).")
    evidence: list[str] = Field(default_factory=list, description="The evidence test's decisions, per type and order.")


class ExportResultView(BaseModel):
    format: Literal["sft", "dpo", "reward_model"]
    num_examples: int
    examples: list[dict[str, Any]] = Field(description="Empty when written to output_path.")
    exported_at: str
    output_path: str | None = None


def register_ml_tools(mcp: FastMCP, ml: MLService, actors: ActorResolver) -> None:
    tools = ToolRegistry[MLService](mcp, ml, actors)

    @tools.tool(writes("Retrain ranker"))
    async def amfs_retrain(ctx: Context, entity_path: EntityFilter = None) -> RetrainResult:
        """Train the learned retrieval ranker on outcome history (entries read before clean outcomes vs
        incidents); it then takes 30% of amfs_retrieve's fusion. Needs 20+ outcome-linked reads; says
        what is missing otherwise. entity_path trains a model just for that entity, used only by retrievals
        at or under it."""
        progress = ThreadProgress(ctx)
        try:
            metrics = await ml.retrain(entity_path, progress=progress)
        finally:
            await progress.drain()
        return RetrainResult(**metrics.to_dict(), learned_weight=ml.service.retrieval_weights(entity_path)["learned"])

    @tools.tool(writes("Calibrate confidence"))
    async def amfs_calibrate(
        ctx: Context,
        per_entity: Annotated[bool, Field(description="Add overrides for entities with 5+ outcomes of a type.")] = False,
        apply: Annotated[bool, Field(description="Make the calibrated multipliers the ones outcomes use.")] = False,
        revert: Annotated[bool, Field(description="Undo an earlier apply: back to the configured multipliers.")] = False,
    ) -> CalibrateResult:
        """Learn outcome multipliers from outcome history: how often entries behind each outcome type
        later end up in incidents. Reports only, unless apply=true; revert=true undoes an apply. Needs
        5+ outcomes per type; says what is missing otherwise. apply changes only types whose change is
        significant (20+ outcomes, bootstrap interval) and says why when it changes nothing."""
        if revert and apply:
            raise ValidationError("apply and revert contradict each other; pass one of them. Nothing was changed.")
        if revert:
            in_force = await ml.revert_calibration()
            return CalibrateResult(applied=False, reverted=True, multipliers_in_force=in_force)
        progress = ThreadProgress(ctx)
        try:
            report = await ml.calibrate(per_entity=per_entity, apply=apply, progress=progress)
        finally:
            await progress.drain()
        return CalibrateResult.model_validate(report.to_dict())

    @tools.tool(writes("Export training data"))
    async def amfs_export_training_data(
        ctx: Context,
        format: Annotated[
            Literal["sft", "dpo", "reward_model"],
            Field(description="sft: chat examples; dpo: chosen/rejected pairs; reward_model: labelled entries."),
        ] = "sft",
        entity_path: EntityFilter = None,
        limit: Annotated[int, Field(ge=1, le=100_000)] = DEFAULT_EXPORT_LIMIT,
        output_path: Annotated[
            str | None,
            Field(min_length=1, max_length=500, description="Write JSONL to this file (relative, under the server's export dir)."),
        ] = None,
    ) -> ExportResultView:
        """Export decision traces as fine-tuning data (JSONL-ready): SFT (clean traces), DPO (clean vs
        failed per entity) or reward-model labels. Returns the examples, or writes them to output_path.
        Says which data is missing when there is nothing to export."""
        progress = ThreadProgress(ctx)
        try:
            credential = tools.actor.credential()
            result = await ml.export_training_data(
                ExportFormat(format), entity_path, limit, output_path, progress=progress,
                namespace=credential.agent_id if credential is not None else None,
            )
        finally:
            await progress.drain()
        return ExportResultView.model_validate(result.to_dict())


__all__ = ["ML_TOOLS", "register_ml_tools"]
