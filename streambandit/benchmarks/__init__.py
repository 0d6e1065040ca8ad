"""The side-by-side benchmark behind ``streambandit bench``: one seeded synthetic stream fed to
streambandit's learners and, in the same run, to the libraries a user would pick instead.

``stream`` builds the stream and scores regret, ``peers`` adapts each library to one
``run(arms, rewards) -> chosen`` call, ``inprocess`` times them (each in its own process, for
peak memory) and writes the table. The peer libraries are benchmark-only dependencies
(``pip install 'streambandit[bench]'``): nothing here imports them at module level.
"""
