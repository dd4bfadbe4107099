"""Runs on a real vLLM engine and through real servers: the runner that drives an engine, the
engine bench, calibration, profiles, replays, the noise study, servers started for a run, the
door's sessions and the agent harnesses.
"""
