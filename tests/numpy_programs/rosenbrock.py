"""Gradient descent on the n-dimensional Rosenbrock function."""
import numpy as np

n, steps, lr = 200, 300, 1e-3  # size
x = np.linspace(-1.2, 1.2, n)
for _ in range(steps):
    grad = np.zeros_like(x)
    grad[:-1] = -400.0 * x[:-1] * (x[1:] - x[:-1] ** 2) - 2.0 * (1 - x[:-1])
    grad[1:] += 200.0 * (x[1:] - x[:-1] ** 2)
    x = x - lr * grad
f = np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)
result = np.append(x, f)
