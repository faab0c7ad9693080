"""moe history stores changes; deployments keep their placement and its version

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-06 06:30:00

History rows of MoE deployments now hold the slots a report changed, not the whole
placement: the deployment row keeps the current placement and the version that set it
(the ETag a runtime's report or confirmation must match). Older rows keep their
placement (the column becomes nullable) and read as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("moe_deployments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("placement", sa.LargeBinary(), nullable=True))
        batch_op.add_column(sa.Column("placement_version", sa.Integer(), server_default="0", nullable=False))
    # deployments already running: their placement is that of their newest version
    op.execute("UPDATE moe_deployments SET placement_version = current_version")
    with op.batch_alter_table("moe_placements", schema=None) as batch_op:
        batch_op.add_column(sa.Column("change", sa.LargeBinary(), nullable=True))
        batch_op.add_column(sa.Column("status", sa.String(length=20), server_default="answered", nullable=False))
        batch_op.add_column(sa.Column("placement_version", sa.Integer(), nullable=True))
        batch_op.alter_column("placement", existing_type=sa.LargeBinary(), nullable=True)


def downgrade() -> None:
    # rows that hold only a change cannot be turned back into whole placements: they go
    op.execute("DELETE FROM moe_placements WHERE placement IS NULL")
    with op.batch_alter_table("moe_placements", schema=None) as batch_op:
        batch_op.alter_column("placement", existing_type=sa.LargeBinary(), nullable=False)
        batch_op.drop_column("placement_version")
        batch_op.drop_column("status")
        batch_op.drop_column("change")
    with op.batch_alter_table("moe_deployments", schema=None) as batch_op:
        batch_op.drop_column("placement_version")
        batch_op.drop_column("placement")
