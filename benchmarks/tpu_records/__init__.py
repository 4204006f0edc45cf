"""The TPU figures' records and the two tools that keep the docs' figures equal to them."""
