"""`viewgate bench`: measure viewgate on this machine, group by group, into bench/results.json.

runner.py brings up what the groups need and runs them; group.py holds what a group is,
gets and returns (Group, BenchContext, Sizes, GroupResult, BenchError), so the groups
import it and never the runner; each measurement group (engine.py, gateway.py,
subscriptions.py) is one module exporting a `Group`; load.py and servers.py
are the gateway group's load generator and servers under test; results.py merges
figures into the results file; report.py prints the table and draws the plots.
"""
