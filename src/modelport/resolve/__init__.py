"""What a user asks, resolved into the pipeline's terms: tensor specs from their strings, and the precision
each target's artifact takes."""
