"""The app's screens: the dashboard, a user's detail, help, and the recording prompt."""
