"""Black-Scholes prices of European call and put options (cumulative normal by Abramowitz-Stegun)."""
import numpy as np


def cnd(d):
    a1, a2, a3, a4, a5 = 0.31938153, -0.356563782, 1.781477937, -1.821255978, 1.330274429
    k = 1.0 / (1.0 + 0.2316419 * np.abs(d))
    w = 1.0 - 1.0 / np.sqrt(2 * np.pi) * np.exp(-d * d / 2.0) * (
        a1 * k + a2 * k ** 2 + a3 * k ** 3 + a4 * k ** 4 + a5 * k ** 5)
    return np.where(d < 0, 1.0 - w, w)


n = 20_000  # size
i = np.arange(n)
S = 50.0 + 50.0 * ((i * 7919) % 1000) / 1000.0
X = 40.0 + 60.0 * ((i * 104729) % 1000) / 1000.0
T = 0.25 + 2.0 * ((i * 31337) % 1000) / 1000.0
r, v = 0.02, 0.30
d1 = (np.log(S / X) + (r + v * v / 2.0) * T) / (v * np.sqrt(T))
d2 = d1 - v * np.sqrt(T)
call = S * cnd(d1) - X * np.exp(-r * T) * cnd(d2)
put = X * np.exp(-r * T) * cnd(-d2) - S * cnd(-d1)
result = np.stack([call, put])
