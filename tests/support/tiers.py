"""How thorough a property test is: `make test` runs every example, `make test-fast` a fifth.

The fast tier (`SANDGATE_TEST_TIER=fast`, set by `make test-fast`) is for feedback while editing;
the full suite and CI run each property with the examples its test asks for.
"""

from __future__ import annotations

import os

FAST = os.environ.get("SANDGATE_TEST_TIER") == "fast"
FAST_DEFAULT_EXAMPLES = 20  # for properties that name no count (Hypothesis' default is 100)


def examples(thorough: int) -> int:
    """The examples a property runs in this tier: `thorough` in the full suite."""
    return max(10, thorough // 5) if FAST else thorough
