"""The staff console: one view per page, one view per action, one module per area.

Pages are plain HTML that work without JavaScript; htmx only refreshes the partials that
poll (overview stats, bucket table, rebuild progress) and swaps the audit verification
result in place. What every view shares (the permission decorator, the action helper) is
in `common`; the URLs are in seasons/staff_urls.py.
"""
