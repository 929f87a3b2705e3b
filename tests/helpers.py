"""Small helpers shared by the Ray tests."""

import time


def wait_until(condition, seconds: float = 20.0) -> bool:
    """Poll `condition` every 0.2 s until it holds or `seconds` pass; its last answer."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def resources_back(ray, before: dict) -> bool:
    """Every CPU is free again and no placement group is left beyond those held before (a shared fixture's)."""
    now = ray.available_resources()
    bundles = lambda res: {k for k in res if k.startswith("bundle_group")}  # noqa: E731
    return now.get("CPU", 0) >= before.get("CPU", 0) and bundles(now) <= bundles(before)
