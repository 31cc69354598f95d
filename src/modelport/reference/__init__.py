"""The inputs every hop is judged on: sample sets, and what each input is for."""
