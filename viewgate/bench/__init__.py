"""`viewgate bench`: measure viewgate on this machine, group by group, into bench/results.json.

runner.py brings up what the groups need and runs them; each measurement group (engine.py,
later the gateway and subscriptions) is one module exporting a `Group`; results.py merges
figures into the results file; report.py prints the table and draws the plots.
"""
