"""2-D heat equation, explicit finite differences (Jacobi sweeps with slices)."""
import numpy as np

n, steps, alpha = 48, 60, 0.2  # size
u = np.zeros((n, n))
u[0, :] = 100.0
u[:, 0] = 50.0
for _ in range(steps):
    lap = u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4 * u[1:-1, 1:-1]
    u[1:-1, 1:-1] = u[1:-1, 1:-1] + alpha * lap
result = u
