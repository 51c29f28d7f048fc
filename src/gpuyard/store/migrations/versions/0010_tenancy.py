"""tenancy: account status and billing, invitations, project members, quotas, credits,
account events, webhook deliveries and the audit trail

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("accounts") as batch:
        batch.add_column(
            sa.Column("status", sa.String(20), nullable=False, server_default="active")
        )
        batch.add_column(sa.Column("status_reason", sa.String(500), nullable=True))
        batch.add_column(sa.Column("status_changed_at", sa.DateTime(), nullable=True))
        batch.add_column(
            sa.Column("billing_mode", sa.String(20), nullable=False, server_default="postpaid")
        )
        batch.add_column(sa.Column("prepaid_since", sa.DateTime(), nullable=True))
        batch.add_column(sa.Column("monthly_budget_micro", sa.BigInteger(), nullable=True))
        batch.add_column(
            sa.Column("alert_percent", sa.Integer(), nullable=False, server_default="80")
        )
        batch.add_column(
            sa.Column("low_balance_hours", sa.Float(), nullable=False, server_default="24")
        )
        batch.add_column(sa.Column("webhook_url", sa.String(2000), nullable=True))
        batch.add_column(sa.Column("webhook_secret", sa.Text(), nullable=True))
        batch.add_column(sa.Column("exhausted_at", sa.DateTime(), nullable=True))
    with op.batch_alter_table("members") as batch:
        batch.add_column(sa.Column("created_at", sa.DateTime(), nullable=True))
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(
            sa.Column("restricted", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("project_id", sa.Integer(), nullable=True))
        batch.create_foreign_key("fk_api_keys_project_id", "projects", ["project_id"], ["id"])
    op.create_table(
        "project_members",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("project_id", sa.Integer(), sa.ForeignKey("projects.id"), nullable=False),
        sa.Column("member_id", sa.Integer(), sa.ForeignKey("members.id"), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("project_id", "member_id"),
    )
    op.create_index("ix_project_members_project_id", "project_members", ["project_id"])
    op.create_index("ix_project_members_member_id", "project_members", ["member_id"])
    op.create_table(
        "invitations",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("account_id", sa.Integer(), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("email", sa.String(320), nullable=False),
        sa.Column("role", sa.String(20), nullable=False),
        sa.Column("project_ids", sa.JSON(), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("invited_by_user_id", sa.Integer(), sa.ForeignKey("users.id"), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.Column("accepted_at", sa.DateTime(), nullable=True),
        sa.Column("accepted_user_id", sa.Integer(), sa.ForeignKey("users.id"), nullable=True),
        sa.Column("revoked_at", sa.DateTime(), nullable=True),
    )
    op.create_index("ix_invitations_account_id", "invitations", ["account_id"])
    op.create_table(
        "quotas",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("account_id", sa.Integer(), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("resource", sa.String(30), nullable=False),
        sa.Column("gpu_type", sa.String(100), nullable=False, server_default=""),
        sa.Column("limit_value", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("account_id", "project_id", "resource", "gpu_type"),
    )
    op.create_index("ix_quotas_account_id", "quotas", ["account_id"])
    op.create_table(
        "account_credits",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("account_id", sa.Integer(), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("amount_micro", sa.BigInteger(), nullable=False),
        sa.Column("note", sa.String(500), nullable=False, server_default=""),
        sa.Column("created_by_user_id", sa.Integer(), sa.ForeignKey("users.id"), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_account_credits_account_id", "account_credits", ["account_id"])
    op.create_table(
        "account_events",
        sa.Column("id", _BIG_ID, primary_key=True),
        sa.Column("account_id", sa.Integer(), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("message", sa.String(1000), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.Column("dedupe", sa.String(200), nullable=True, unique=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_account_events_account", "account_events", ["account_id", "id"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("account_id", sa.Integer(), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("event_id", sa.BigInteger(), nullable=False),
        sa.Column("url", sa.String(2000), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(), nullable=False),
        sa.Column("last_error", sa.String(1000), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("delivered_at", sa.DateTime(), nullable=True),
    )
    op.create_index("ix_webhook_deliveries_account_id", "webhook_deliveries", ["account_id"])
    op.create_index(
        "ix_webhook_deliveries_due", "webhook_deliveries", ["status", "next_attempt_at"]
    )
    op.create_table(
        "audit_events",
        sa.Column("id", _BIG_ID, primary_key=True),
        sa.Column("account_id", sa.Integer(), nullable=True),
        sa.Column("actor_user_id", sa.Integer(), nullable=True),
        sa.Column("actor_email", sa.String(320), nullable=True),
        sa.Column("member_id", sa.Integer(), nullable=True),
        sa.Column("key_id", sa.Integer(), nullable=True),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target_type", sa.String(40), nullable=False),
        sa.Column("target_id", sa.String(100), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.Column("request_id", sa.String(100), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_audit_events_account", "audit_events", ["account_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_audit_events_account", table_name="audit_events")
    op.drop_table("audit_events")
    op.drop_index("ix_webhook_deliveries_due", table_name="webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_account_id", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_index("ix_account_events_account", table_name="account_events")
    op.drop_table("account_events")
    op.drop_index("ix_account_credits_account_id", table_name="account_credits")
    op.drop_table("account_credits")
    op.drop_index("ix_quotas_account_id", table_name="quotas")
    op.drop_table("quotas")
    op.drop_index("ix_invitations_account_id", table_name="invitations")
    op.drop_table("invitations")
    op.drop_index("ix_project_members_member_id", table_name="project_members")
    op.drop_index("ix_project_members_project_id", table_name="project_members")
    op.drop_table("project_members")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_constraint("fk_api_keys_project_id", type_="foreignkey")
        batch.drop_column("project_id")
        batch.drop_column("restricted")
    with op.batch_alter_table("members") as batch:
        batch.drop_column("created_at")
    with op.batch_alter_table("accounts") as batch:
        for column in (
            "exhausted_at",
            "webhook_secret",
            "webhook_url",
            "low_balance_hours",
            "alert_percent",
            "monthly_budget_micro",
            "prepaid_since",
            "billing_mode",
            "status_changed_at",
            "status_reason",
            "status",
        ):
            batch.drop_column(column)
