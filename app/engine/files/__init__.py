"""Files: prefix states in both formats, projects, and safe user-file I/O."""
