"""1-D wave equation with fixed ends (leapfrog), a plucked string."""
import numpy as np

n, steps, c = 401, 300, 0.5  # size
x = np.linspace(0.0, 1.0, n)
u = np.where(x < 0.3, x / 0.3, (1.0 - x) / 0.7) * 0.01
u_prev = u.copy()
for _ in range(steps):
    u_next = np.zeros(n)
    u_next[1:-1] = 2 * u[1:-1] - u_prev[1:-1] + c ** 2 * (u[2:] - 2 * u[1:-1] + u[:-2])
    u_prev, u = u, u_next
result = np.stack([u, u_prev])
