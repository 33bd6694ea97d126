"""Gaussian elimination with partial pivoting and back substitution."""
import numpy as np

n = 24  # size
i = np.arange(n)
A = np.cos(np.outer(i, i) * 0.37) + n * np.eye(n)
b = np.sin(i * 0.5)
M = np.hstack([A, b.reshape(n, 1)])
for k in range(n - 1):
    p = k + int(np.argmax(np.abs(M[k:, k])))
    if p != k:
        M[[k, p]] = M[[p, k]]
    factors = M[k + 1:, k] / M[k, k]
    M[k + 1:, k:] = M[k + 1:, k:] - np.outer(factors, M[k, k:])
x = np.zeros(n)
for k in range(n - 1, -1, -1):
    x[k] = (M[k, n] - np.dot(M[k, k + 1:n], x[k + 1:])) / M[k, k]
result = x
