"""Conway's game of life on a torus (neighbour counts with np.roll)."""
import numpy as np

n, gens = 40, 30  # size
board = np.zeros((n, n), dtype=np.int64)
board[1, 2] = board[2, 3] = board[3, 1] = board[3, 2] = board[3, 3] = 1      # a glider
board[20:23, 20] = 1                                                          # a blinker
board[30:32, 30:32] = 1                                                       # a block
for _ in range(gens):
    neighbours = sum(np.roll(np.roll(board, dy, axis=0), dx, axis=1)
                     for dy in (-1, 0, 1) for dx in (-1, 0, 1) if (dy, dx) != (0, 0))
    board = ((neighbours == 3) | ((board == 1) & (neighbours == 2))).astype(np.int64)
result = board
