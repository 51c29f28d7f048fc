"""The fixed, named startup steps and how progress is shown.

A cluster's ``startup_step`` counts completed steps (0..TOTAL_STEPS); percentages
derive from it, so they only grow while the step counter only grows.
"""

from __future__ import annotations

from dataclasses import dataclass

STEPS: tuple[tuple[str, str], ...] = (
    ("initializing", "Validating request"),
    ("initializing", "Allocating resources"),
    ("provisioning", "Preparing storage"),
    ("provisioning", "Restoring snapshot"),
    ("provisioning", "Pulling image"),
    ("provisioning", "Creating container"),
    ("booting", "Starting container"),
    ("booting", "Waiting for readiness"),
)
TOTAL_STEPS = len(STEPS)

# Step counters recorded by the driver: after placement, during a restore, after the
# container was created (volume, snapshot and image are ready by then), and when running.
STEP_ALLOCATED = 2
# While a snapshot is restored into the volume (its current step is "Restoring
# snapshot").
STEP_RESTORING = 3
STEP_CREATED = 6
STEP_READY = 8


@dataclass(frozen=True)
class StartupProgress:
    phase: str
    percentage: int
    current_step: str
    steps_completed: int
    total_steps: int = TOTAL_STEPS


def progress_for(steps_completed: int) -> StartupProgress:
    """Progress after ``steps_completed`` steps; the current step is the next one."""
    done = max(0, min(steps_completed, TOTAL_STEPS))
    phase, label = STEPS[min(done, TOTAL_STEPS - 1)]
    if done == TOTAL_STEPS:
        phase, label = "ready", "Ready"
    return StartupProgress(
        phase=phase,
        percentage=round(done * 100 / TOTAL_STEPS),
        current_step=label,
        steps_completed=done,
    )
