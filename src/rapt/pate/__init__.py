"""PromptPATE: teachers, voting and student selection (``pate``), Confident-GNMax with its RDP
analysis (``gnmax``) and the LLM label scorer the teachers vote with (``scorer``)."""
