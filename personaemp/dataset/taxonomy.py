"""AlpsBench's memory-label taxonomy (the paths its data uses) and label families: what
extract-memories may write and how --compare-gold groups labels."""

from __future__ import annotations

import re

# AlpsBench's label taxonomy: the paths its annotated data uses (each at least 4 times in the
# 3,275 gold memories of the 1,200-session sample; the rare one-off paths left out).
TAXONOMY = (
    "Personal_Background/Identity", "Personal_Background/Education", "Personal_Background/Occupation",
    "Personal_Background/Location", "Personal_Background/Family",
    "States_Experiences/Physical_State", "States_Experiences/Mental_State",
    "States_Experiences/Past_Experience",
    "Possessions/Important_Items", "Possessions/Pet", "Possessions/House", "Possessions/Car",
    "Preferences/Food", "Preferences/Entertainment", "Preferences/Sports", "Preferences/Reading",
    "Preferences/Music", "Preferences/Travel_Mode", "Preferences/Shopping",
    "Preferences/Interaction_Preferences", "Preferences/Education",
    "Thoughts/Opinions/Positive", "Thoughts/Opinions/Negative", "Thoughts/Curiosity",
    "Thoughts/Goals/Short_Term", "Thoughts/Goals/Long_Term",
    "Plans/Schedule", "Plans/Commitments",
    "Social_Relationships/Family", "Social_Relationships/Friends", "Social_Relationships/Colleagues",
    "Social_Relationships/Partners", "Social_Relationships/Adversarial",
    "Constraints_and_Boundaries/Disliked_Topics", "Constraints_and_Boundaries/Sensitive_Topics",
    "Constraints_and_Boundaries/Do_Not_Remember", "Constraints_and_Boundaries/Interaction_Preferences",
)  # fmt: skip


UNMAPPED = "UNMAPPED"


def label_family(label: str | None, suggestion: str | None = None) -> str:
    """The first part of a label path; an UNMAPPED memory's suggestion names it when it
    starts with a family of the taxonomy, else it stays UNMAPPED."""
    families = {path.split("/")[0] for path in TAXONOMY}
    if label and label != UNMAPPED:
        return label.split("/")[0].strip()
    head = re.split(r"[/|]", suggestion or "")[0].strip()
    return head if head in families else UNMAPPED
