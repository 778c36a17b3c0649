"""llama.cpp's sequence states: their bytes read and checked, and the two state file formats."""
