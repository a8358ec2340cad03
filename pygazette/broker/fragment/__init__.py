"""The broker's fragment lifecycle, as Gazette keeps it in `broker/fragment`.

It owns spools being written (`spool`), the cover set and index of a journal's fragments
(`cover_set`, `fragment_index`), persisting closed spools to fragment stores (`persister`),
fragment file naming under path postfix templates (`path_postfix`, `go_time_format`) and
retention of persisted fragments (`retention`). Import the modules themselves: this package
re-exports nothing, so importing one of them loads only what it needs.
"""
