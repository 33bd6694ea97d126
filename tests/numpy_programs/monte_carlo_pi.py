"""Monte Carlo estimate of pi with NumPy's Generator, and with the legacy global state."""
import numpy as np

rng = np.random.default_rng(2024)
n, m = 200_000, 50_000  # size
x = rng.random(n)
y = rng.random(n)
inside = (x * x + y * y) <= 1.0
pi1 = 4.0 * np.count_nonzero(inside) / n
np.random.seed(7)
pts = np.random.random((m, 2))
pi2 = 4.0 * np.mean(np.sum(pts ** 2, axis=1) <= 1.0)
result = np.array([pi1, pi2])
