"""Results and persistence: the project file that keeps a session and its results."""
