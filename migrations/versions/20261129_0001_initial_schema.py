"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29 13:11:23.947740

Every table of the service, plus the built-in `default` tenant that owns
everything while authentication is off (embedded mode).
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

DEFAULT_TENANT_ID = "00000000-0000-0000-0000-000000000000"

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
        sa.UniqueConstraint("name", name=op.f("uq_tenants_name")),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("tenant_id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("scopes", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_api_keys_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_api_keys_prefix"), ["prefix"], unique=False)
        batch_op.create_index(batch_op.f("ix_api_keys_tenant_id"), ["tenant_id"], unique=False)

    op.create_table(
        "calibrations",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("tenant_id", sa.String(length=36), nullable=False),
        sa.Column("inventory_hash", sa.String(length=64), nullable=False),
        sa.Column(
            "factors", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=False
        ),
        sa.Column("n_timelines", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_calibrations_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_calibrations")),
        sa.UniqueConstraint("tenant_id", "inventory_hash", name=op.f("uq_calibrations_tenant_id_inventory_hash")),
    )
    with op.batch_alter_table("calibrations", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_calibrations_tenant_id"), ["tenant_id"], unique=False)

    op.create_table(
        "graphs",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("tenant_id", sa.String(length=36), nullable=False),
        sa.Column("model_hash", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("source_format", sa.String(length=16), nullable=False),
        sa.Column("n_ops", sa.Integer(), nullable=False),
        sa.Column("n_tensors", sa.Integer(), nullable=False),
        sa.Column("total_flops", sa.Float(), nullable=False),
        sa.Column("parameter_bytes", sa.Float(), nullable=False),
        sa.Column("activation_bytes", sa.Float(), nullable=False),
        sa.Column(
            "warnings", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=False
        ),
        sa.Column("canonical", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_graphs_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_graphs")),
        sa.UniqueConstraint("tenant_id", "model_hash", name=op.f("uq_graphs_tenant_id_model_hash")),
    )
    with op.batch_alter_table("graphs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_graphs_tenant_id"), ["tenant_id"], unique=False)

    op.create_table(
        "idempotency_keys",
        sa.Column("tenant_id", sa.String(length=36), nullable=False),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("route", sa.String(length=100), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=False),
        sa.Column("response", sa.LargeBinary(), nullable=False),
        sa.Column("location", sa.String(length=300), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_idempotency_keys_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("tenant_id", "key", name=op.f("pk_idempotency_keys")),
    )
    with op.batch_alter_table("idempotency_keys", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_idempotency_keys_tenant_id"), ["tenant_id"], unique=False)

    op.create_table(
        "inventories",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("tenant_id", sa.String(length=36), nullable=False),
        sa.Column("inventory_hash", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("n_devices", sa.Integer(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_inventories_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_inventories")),
        sa.UniqueConstraint("tenant_id", "inventory_hash", name=op.f("uq_inventories_tenant_id_inventory_hash")),
    )
    with op.batch_alter_table("inventories", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_inventories_tenant_id"), ["tenant_id"], unique=False)

    op.create_table(
        "moe_deployments",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("tenant_id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column(
            "config", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=False
        ),
        sa.Column("current_version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_moe_deployments_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_moe_deployments")),
        sa.UniqueConstraint("tenant_id", "name", name=op.f("uq_moe_deployments_tenant_id_name")),
    )
    with op.batch_alter_table("moe_deployments", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_moe_deployments_tenant_id"), ["tenant_id"], unique=False)

    op.create_table(
        "moe_placements",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("tenant_id", sa.String(length=36), nullable=False),
        sa.Column("deployment_id", sa.String(length=36), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("kept_current", sa.Boolean(), nullable=False),
        sa.Column(
            "balance", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=False
        ),
        sa.Column("slots_moved", sa.Integer(), nullable=False),
        sa.Column("load", sa.LargeBinary(), nullable=False),
        sa.Column("placement", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["deployment_id"],
            ["moe_deployments.id"],
            name=op.f("fk_moe_placements_deployment_id_moe_deployments"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_moe_placements_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_moe_placements")),
        sa.UniqueConstraint("deployment_id", "version", name=op.f("uq_moe_placements_deployment_id_version")),
    )
    with op.batch_alter_table("moe_placements", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_moe_placements_deployment_id"), ["deployment_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_moe_placements_tenant_id"), ["tenant_id"], unique=False)

    op.create_table(
        "plans",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("tenant_id", sa.String(length=36), nullable=False),
        sa.Column("graph_id", sa.String(length=36), nullable=False),
        sa.Column("inventory_id", sa.String(length=36), nullable=False),
        sa.Column("parent_id", sa.String(length=36), nullable=True),
        sa.Column("model_hash", sa.String(length=64), nullable=False),
        sa.Column("inventory_hash", sa.String(length=64), nullable=False),
        sa.Column("cache_key", sa.String(length=64), nullable=False),
        sa.Column(
            "options", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=False
        ),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("progress", sa.Float(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("strategy", sa.String(length=64), nullable=True),
        sa.Column(
            "summary", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=True
        ),
        sa.Column("result", sa.LargeBinary(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["graph_id"], ["graphs.id"], name=op.f("fk_plans_graph_id_graphs"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["inventory_id"], ["inventories.id"], name=op.f("fk_plans_inventory_id_inventories"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["parent_id"], ["plans.id"], name=op.f("fk_plans_parent_id_plans"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_plans_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_plans")),
        sa.UniqueConstraint("tenant_id", "cache_key", name=op.f("uq_plans_tenant_id_cache_key")),
    )
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_plans_graph_id"), ["graph_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_plans_inventory_id"), ["inventory_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_plans_parent_id"), ["parent_id"], unique=False)
        batch_op.create_index("ix_plans_tenant_created", ["tenant_id", "created_at", "id"], unique=False)
        batch_op.create_index(batch_op.f("ix_plans_tenant_id"), ["tenant_id"], unique=False)
        batch_op.create_index(
            "ix_plans_tenant_model_created", ["tenant_id", "model_hash", "created_at", "id"], unique=False
        )

    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("tenant_id", sa.String(length=36), nullable=False),
        sa.Column("plan_id", sa.String(length=36), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("lease_owner", sa.String(length=100), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["plan_id"], ["plans.id"], name=op.f("fk_jobs_plan_id_plans"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_jobs_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("plan_id", name=op.f("uq_jobs_plan_id")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index("ix_jobs_status_lease", ["status", "lease_expires_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_jobs_tenant_id"), ["tenant_id"], unique=False)

    op.create_table(
        "plan_feedback",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("tenant_id", sa.String(length=36), nullable=False),
        sa.Column("plan_id", sa.String(length=36), nullable=False),
        sa.Column("model_hash", sa.String(length=64), nullable=False),
        sa.Column("inventory_hash", sa.String(length=64), nullable=False),
        sa.Column("source_format", sa.String(length=32), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=True),
        sa.Column("hardware_notes", sa.Text(), nullable=False),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("matched_events", sa.Integer(), nullable=False),
        sa.Column("unmatched_events", sa.Integer(), nullable=False),
        sa.Column("measured_makespan_s", sa.Float(), nullable=True),
        sa.Column("timeline", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["plan_id"], ["plans.id"], name=op.f("fk_plan_feedback_plan_id_plans"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_plan_feedback_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_plan_feedback")),
    )
    with op.batch_alter_table("plan_feedback", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_plan_feedback_plan_id"), ["plan_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_plan_feedback_tenant_id"), ["tenant_id"], unique=False)
        batch_op.create_index(
            "ix_plan_feedback_tenant_model_created", ["tenant_id", "model_hash", "created_at"], unique=False
        )
    tenants = sa.table(
        "tenants",
        sa.column("id", sa.String),
        sa.column("name", sa.String),
        sa.column("created_at", sa.DateTime(timezone=True)),
    )
    op.bulk_insert(tenants, [{"id": DEFAULT_TENANT_ID, "name": "default", "created_at": datetime.now(UTC)}])


def downgrade() -> None:
    with op.batch_alter_table("plan_feedback", schema=None) as batch_op:
        batch_op.drop_index("ix_plan_feedback_tenant_model_created")
        batch_op.drop_index(batch_op.f("ix_plan_feedback_tenant_id"))
        batch_op.drop_index(batch_op.f("ix_plan_feedback_plan_id"))

    op.drop_table("plan_feedback")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_tenant_id"))
        batch_op.drop_index("ix_jobs_status_lease")

    op.drop_table("jobs")
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.drop_index("ix_plans_tenant_model_created")
        batch_op.drop_index(batch_op.f("ix_plans_tenant_id"))
        batch_op.drop_index("ix_plans_tenant_created")
        batch_op.drop_index(batch_op.f("ix_plans_parent_id"))
        batch_op.drop_index(batch_op.f("ix_plans_inventory_id"))
        batch_op.drop_index(batch_op.f("ix_plans_graph_id"))

    op.drop_table("plans")
    with op.batch_alter_table("moe_placements", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_moe_placements_tenant_id"))
        batch_op.drop_index(batch_op.f("ix_moe_placements_deployment_id"))

    op.drop_table("moe_placements")
    with op.batch_alter_table("moe_deployments", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_moe_deployments_tenant_id"))

    op.drop_table("moe_deployments")
    with op.batch_alter_table("inventories", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_inventories_tenant_id"))

    op.drop_table("inventories")
    with op.batch_alter_table("idempotency_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_idempotency_keys_tenant_id"))

    op.drop_table("idempotency_keys")
    with op.batch_alter_table("graphs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_graphs_tenant_id"))

    op.drop_table("graphs")
    with op.batch_alter_table("calibrations", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_calibrations_tenant_id"))

    op.drop_table("calibrations")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_keys_tenant_id"))
        batch_op.drop_index(batch_op.f("ix_api_keys_prefix"))

    op.drop_table("api_keys")
    op.drop_table("tenants")
