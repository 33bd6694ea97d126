"""Doolittle LU decomposition of a diagonally dominant matrix, checked by reconstructing it."""
import numpy as np

n = 20  # size
i = np.arange(n, dtype=float)
A = np.sin(np.add.outer(i, 2 * i)) + 2 * n * np.identity(n)
L = np.identity(n)
U = np.zeros((n, n))
for k in range(n):
    U[k, k:] = A[k, k:] - L[k, :k] @ U[:k, k:]
    L[k + 1:, k] = (A[k + 1:, k] - L[k + 1:, :k] @ U[:k, k]) / U[k, k]
result = np.concatenate([L, U, L @ U - A])
