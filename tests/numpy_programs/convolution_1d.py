"""1-D convolution: a smoothing filter by np.convolve and by shifted sums, and a correlation."""
import numpy as np

m = 500  # size
t = np.linspace(0, 4 * np.pi, m)
signal = np.sin(t) + 0.3 * np.sin(7 * t)
kernel = np.array([1.0, 4.0, 6.0, 4.0, 1.0]) / 16.0
smooth = np.convolve(signal, kernel, mode="same")
shifted = sum(kernel[k] * signal[k:len(signal) - 4 + k] for k in range(5))
corr = np.correlate(signal[:100], kernel, mode="valid")
result = np.concatenate([smooth, shifted, corr])
