"""The radix cache: the tree, its tiers, compaction, and the work context runs evaluate in."""
