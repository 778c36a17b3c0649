"""The radix cache: the tree, its tiers, compaction, and the sequences it lends to runs."""
