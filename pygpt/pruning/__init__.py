"""Structured pruning: attention heads and MLP hidden units ranked by their importance on data
(pygpt.pruning.importance) and removed from the weights (pygpt.pruning.shrink), so the pruned
model is a smaller model of its family; `python -m pygpt.prune` is the command line."""
from pygpt.pruning.importance import Scores, importance, masked, ones_masks, units_of
from pygpt.pruning.shrink import (check_globally_prunable, check_prunable, choose,
                                  choose_globally, ranked_globally, removed_count, shrink)

__all__ = ["Scores", "check_globally_prunable", "check_prunable", "choose", "choose_globally", "importance", "masked",
           "ones_masks", "ranked_globally", "removed_count", "shrink", "units_of"]
