"""What a person runs before installing the chart: `images` (the images an install pulls, a mirror's values)."""
