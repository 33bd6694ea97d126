"""X-ray projection of a 2-D phantom: Beer-Lambert attenuation along rows and columns, and a back projection."""
import numpy as np

n = 64  # size
y, x = np.mgrid[-1:1:n * 1j, -1:1:n * 1j]
phantom = np.where(x ** 2 + y ** 2 < 0.8, 0.2, 0.0)
phantom = phantom + np.where((x - 0.2) ** 2 / 0.04 + (y + 0.1) ** 2 / 0.09 < 1.0, 0.5, 0.0)
phantom = phantom + np.where(np.abs(x + 0.4) + np.abs(y - 0.3) < 0.15, 1.0, 0.0)
dl = 2.0 / n
proj_rows = np.exp(-phantom.sum(axis=1) * dl)
proj_cols = np.exp(-phantom.sum(axis=0) * dl)
back = -np.log(proj_rows)[:, np.newaxis] - np.log(proj_cols)[np.newaxis, :]
result = np.concatenate([proj_rows, proj_cols, back.ravel()])
